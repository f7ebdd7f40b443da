"""engine_sim — a simulated vLLM engine behind an HTTP port, for the gateway tests and bench.

Why: the shipped gateways (deploy/nginx, deploy/haproxy) proxy OpenAI requests to engines and
ask kvrouterd where to send them; testing them needs engines that (1) answer the OpenAI routes,
(2) keep a prefix cache whose hits we can count, and (3) publish the KV events of what they
computed, so kvrouterd learns who holds what. The prefix cache and the event wire are the
engine emulator's (vllm_pub.Engine: vLLM's BlockPool in miniature, LRU eviction, real
ZeroMQ/msgpack batches); this file only adds the HTTP face and the tokenizer.

* POST /v1/completions ({"model", "prompt": text}) and /v1/chat/completions ({"model",
  "messages"}) answer an OpenAI-shaped JSON object with a short fixed completion.
* The prompt text, or the messages (rendered with the model's chat template, as vLLM does),
  are tokenized by a kvrouterd's POST /v1/tokenize (`tokenize_port`), i.e. the same
  tokenizer and template (and so the same block hashes) the router uses: the test exercises
  the real text and chat paths. Pass the port of a kvrouterd the test does not kill (the engine's own
  tokenizer must not depend on the router being up).
* The engine's pod (the KV-event topic kv@<pod>@<model>) is "127.0.0.1:<its HTTP port>":
  the gateways map a pod that is "host:port" straight to an upstream.
* Every answer carries X-Engine-Pod, X-Engine-Cached-Blocks (leading blocks found in its
  prefix cache) and X-Engine-Query-Blocks (full blocks of the prompt); GET /stats sums them.
"""

import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm_pub import Engine

COMPLETION_TEXT = " Sure, here is a short answer."


def tokenize(port, model, text=None, messages=None, timeout=5):
    """Token ids of a prompt text, or of chat messages rendered with the model's chat
    template (as vLLM's /v1/chat/completions does), by a kvrouterd's /v1/tokenize."""
    body = {"model": model}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = text
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/tokenize", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError("tokenize: HTTP %d %s" % (resp.status, data[:200]))
        return json.loads(data)["tokens"]
    finally:
        conn.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # one send per response (headers + body; handle_one_request flushes), no Nagle: a
    # header/body split would meet the peer's delayed ACK (40 ms stalls in the latency tails)
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *a):  # quiet
        pass

    def _send(self, status, obj, extra=None):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        sim = self.server.sim
        if self.path == "/stats":
            self._send(200, sim.stats())
        elif self.path in ("/health", "/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": sim.model}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        sim = self.server.sim
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": "body is not JSON"})
            return
        if not isinstance(body, dict):
            self._send(400, {"error": "body is not a JSON object"})
            return
        path = self.path.split("?", 1)[0]
        messages = None
        if path == "/v1/completions":
            text, chat = body.get("prompt"), False
            if not isinstance(text, str):
                self._send(400, {"error": "prompt must be a string"})
                return
        elif path == "/v1/chat/completions":
            text, chat, messages = None, True, body.get("messages")
            if not isinstance(messages, list) or not messages:
                self._send(400, {"error": "messages must be a non-empty array"})
                return
        else:
            self._send(404, {"error": "not found"})
            return
        try:
            hit, query = sim.compute(text, messages)
        except Exception as e:  # tokenizer unreachable etc.: an engine error, visible
            self._send(500, {"error": str(e)})
            return
        rid = "cmpl-%d" % sim.next_id()
        if chat:
            out = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                   "model": sim.model, "choices": [{"index": 0, "finish_reason": "stop",
                   "message": {"role": "assistant", "content": COMPLETION_TEXT}}]}
        else:
            out = {"id": rid, "object": "text_completion", "created": int(time.time()),
                   "model": sim.model, "choices": [{"index": 0, "text": COMPLETION_TEXT,
                                                    "finish_reason": "stop"}]}
        self._send(200, out, {"X-Engine-Pod": sim.pod, "X-Engine-Cached-Blocks": hit,
                              "X-Engine-Query-Blocks": query})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            return  # a gateway closing a kept-alive connection is no engine error
        super().handle_error(request, client_address)


class EngineSim:
    """One simulated engine: HTTP on 127.0.0.1:<port>, KV events to `event_endpoints`
    (kvrouterd's bound SUB endpoints; the emulator connects to them)."""

    def __init__(self, model, event_endpoints, tokenize_port, num_blocks=2048, block_size=16,
                 port=0):
        self.model = model
        self.tokenize_port = tokenize_port
        self.httpd = _Server(("127.0.0.1", port), _Handler)
        self.httpd.sim = self
        self.port = self.httpd.server_address[1]
        self.pod = "127.0.0.1:%d" % self.port
        self.engine = Engine(pod=self.pod, model=model, mode="connect",
                             endpoints=list(event_endpoints), block_size=block_size,
                             num_blocks=num_blocks)
        self.block_size = block_size
        self.lock = threading.Lock()
        self._id = 0
        self.requests = 0
        self.hit_blocks = 0
        self.query_blocks = 0
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def next_id(self):
        with self.lock:
            self._id += 1
            return self._id

    def compute(self, text, messages=None):
        """Tokenizes, runs the prompt through the prefix cache, publishes its events.
        Returns (cached leading blocks, full blocks of the prompt)."""
        tokens = tokenize(self.tokenize_port, self.model, text, messages)
        with self.lock:
            r = self.engine.rank(0)
            hit, _, _ = r.request(tokens)
            r.publish()
            query = len(tokens) // self.block_size
            self.requests += 1
            self.hit_blocks += hit
            self.query_blocks += query
        return hit, query

    def stats(self):
        with self.lock:
            return {"pod": self.pod, "requests": self.requests, "hit_blocks": self.hit_blocks,
                    "query_blocks": self.query_blocks}

    def announce(self):
        """Publishes an empty batch: makes the stream known to a (re)started router."""
        with self.lock:
            self.engine.rank(0).publish()

    def wait_subscriber(self, timeout=10.0):
        self.engine.wait_subscriber(timeout)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.close()
