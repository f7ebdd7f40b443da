"""gwload — run the shipped gateways (deploy/nginx, deploy/haproxy) and drive conversations.

Why: test_gateways.py and bench/gateways.sh both need the real nginx and HAProxy started from
the configurations we ship (only the DEPLOY lines rewritten: ports, engines, kvrouterd's URL,
paths), and the same multi-turn conversation workload; this module holds both.

    gw = Gateway("nginx", engines=["127.0.0.1:9001", ...], route_url="http://...", mode="kvr")
    gw.post("/v1/completions", {"model": M, "prompt": text}) -> (status, headers, body)
    gw.close()

mode="kvr" routes through kvrouterd; mode="rr" is the same gateway doing plain round-robin
(nginx: proxy_pass to the engines' upstream instead of the njs handler; HAProxy: without the
Lua action). Every wait is bounded.
"""

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from kvrharness import free_port  # noqa: F401  (test_partitions imports it from here)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")


def _sub(text, pattern, repl, count=1):
    new, n = re.subn(pattern, lambda m: repl, text, flags=re.M)
    if n < count:
        raise ValueError("shipped config changed: %r not found" % pattern)
    return new


def render_nginx(tmp, port, engines, route_url, mode, fetch_timeout_ms, pd_mode=None):
    with open(os.path.join(DEPLOY, "nginx", "nginx.conf")) as f:
        t = f.read()
    t = _sub(t, r"^worker_processes .*;", "worker_processes 1;")
    t = _sub(t, r"^pid .*;", "pid %s/nginx.pid;" % tmp)
    t = _sub(t, r"^error_log .*;", "error_log %s/error.log info;" % tmp)
    t = _sub(t, r"^(\s*)js_path .*;", "    js_path %s;\n    client_body_temp_path %s/body;\n"
             "    proxy_temp_path %s/proxy;" % (os.path.join(DEPLOY, "nginx"), tmp, tmp))
    t = _sub(t, r"^(\s*server 127\.0\.0\.1:800\d;\n)+",
             "".join("        server %s;\n" % e for e in engines))
    t = _sub(t, r"^\s*listen 8000;", "        listen 127.0.0.1:%d;" % port)
    t = _sub(t, r'^\s*set \$kvr_route_url ".*";', '        set $kvr_route_url "%s";' % route_url)
    t = _sub(t, r'^\s*set \$kvr_engines ".*";', '        set $kvr_engines "%s";' % " ".join(engines))
    t = _sub(t, r"js_fetch_timeout \d+ms;", "js_fetch_timeout %dms;" % fetch_timeout_ms, 2)
    if pd_mode is not None:
        t = _sub(t, r'^\s*set \$kvr_pd_mode ".*";', '        set $kvr_pd_mode "%s";' % pd_mode)
    if mode == "rr":
        # straight to the fallback location (same proxy settings), no njs at all
        t = _sub(t, r"js_content kvr\.route;", "error_page 418 = @kvr_rr; return 418;", 2)
    return t


def render_haproxy(tmp, port, engines, route_url, mode, fetch_timeout_ms):
    with open(os.path.join(DEPLOY, "haproxy", "haproxy.cfg")) as f:
        t = f.read()
    t = _sub(t, r"lua-load \S+", "lua-load %s" % os.path.join(DEPLOY, "haproxy", "kvrouter.lua"))
    t = _sub(t, r"^\s*bind :8000", "    bind 127.0.0.1:%d" % port)
    t = _sub(t, r"^(\s*server 127\.0\.0\.1:800\d 127\.0\.0\.1:800\d\n)+",
             "".join("    server %s %s\n" % (e, e) for e in engines))
    local = free_port()
    router = route_url.split("//", 1)[1].split("/", 1)[0]
    t = _sub(t, r"lua\.kvr_route \S+ kvr_engines \d+ ",
             "lua.kvr_route http://127.0.0.1:%d/v1/route kvr_engines %d "
             % (local, fetch_timeout_ms))
    t = _sub(t, r"^\s*bind 127\.0\.0\.1:8089", "    bind 127.0.0.1:%d" % local)
    t = _sub(t, r"^\s*server kvrouterd \S+ ", "    server kvrouterd %s " % router)
    for what in ("connect", "server"):
        t = _sub(t, r"^\s*timeout %s 20ms" % what,
                 "    timeout %s %dms" % (what, fetch_timeout_ms))
    if mode == "rr":
        t = _sub(t, r"^\s*http-request lua\.kvr_route .*\n", "")
    return t


class Gateway:
    def __init__(self, kind, engines, route_url, mode="kvr", fetch_timeout_ms=100, port=None,
                 pd_mode=None):
        assert kind in ("nginx", "haproxy") and mode in ("kvr", "rr")
        self.kind, self.mode = kind, mode
        self.tmp = tempfile.mkdtemp(prefix="kvr-gw-%s-" % kind)
        os.chmod(self.tmp, 0o755)  # nginx workers run as nobody when started by root
        self.port = port or free_port()
        if kind == "nginx":
            os.makedirs(os.path.join(self.tmp, "body"))
            os.makedirs(os.path.join(self.tmp, "proxy"))
            for d in ("body", "proxy"):
                os.chmod(os.path.join(self.tmp, d), 0o777)
            conf = render_nginx(self.tmp, self.port, engines, route_url, mode, fetch_timeout_ms,
                                pd_mode)
            path = os.path.join(self.tmp, "nginx.conf")
            argv = ["nginx", "-p", self.tmp, "-c", path, "-g", "daemon off;"]
        else:
            conf = render_haproxy(self.tmp, self.port, engines, route_url, mode,
                                  fetch_timeout_ms)
            path = os.path.join(self.tmp, "haproxy.cfg")
            argv = ["haproxy", "-db", "-f", path]
        with open(path, "w") as f:
            f.write(conf)
        self.conf_path = path
        self.log_path = os.path.join(self.tmp, "stderr.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.tmp,
                                     start_new_session=True)
        try:
            self._wait_listening(10)
        except Exception:
            self.close()
            raise

    def _wait_listening(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited (%s): %s" % (self.kind, self.proc.returncode,
                                                            self.log()))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("%s did not listen within %ss: %s" % (self.kind, timeout, self.log()))

    def log(self):
        text = ""
        for p in (self.log_path, os.path.join(self.tmp, "error.log")):
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    text += f.read()
        return text[-4000:]

    def post(self, path, obj, timeout=10, conn=None, headers=None):
        own = conn is None
        if own:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(obj),
                         headers=dict({"Content-Type": "application/json"}, **(headers or {})))
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            if own:
                conn.close()

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        if not os.environ.get("KVR_KEEP_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


# ---- the conversation workload ------------------------------------------------------------

WORDS = ("alpha beta gamma delta kernel cache prefix router engine token block layer tensor "
         "memory queue batch shard replica latency budget vector matrix sample stream model "
         "weight cluster socket thread").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Conversation:
    """Turn k's prompt = turn k-1's prompt + its answer + a new user message; as one text
    (/v1/completions "prompt") or as chat messages (/v1/chat/completions)."""

    def __init__(self, rng, cid, system_words=120, user_words=30, chat=False):
        self.cid = cid
        self.rng = rng
        self.user_words = user_words
        self.chat = chat
        system = "System %d: %s" % (cid, sentence(rng, system_words))
        self.prompt = system + "\n"
        self.messages = [{"role": "system", "content": system}]
        self.turn = 0
        self.last_pod = None

    def next_body(self, model):
        user = sentence(self.rng, self.user_words)
        self.turn += 1
        if self.chat:
            self.messages.append({"role": "user", "content": user})
            return "/v1/chat/completions", {"model": model, "messages": self.messages,
                                            "max_tokens": 16}
        self.prompt += "User: %s\nAssistant:" % user
        return "/v1/completions", {"model": model, "prompt": self.prompt, "max_tokens": 16}

    def answered(self, answer, pod):
        choice = answer["choices"][0]
        if self.chat:
            self.messages.append({"role": "assistant", "content": choice["message"]["content"]})
        else:
            self.prompt += choice["text"] + "\n"
        self.last_pod = pod


def schedule(rng, n_conv, turns):
    """A seeded interleaving of the conversations' turns (each conversation in order): a
    fixed cyclic order would let round-robin land every conversation on one engine. No
    conversation again within 2 requests while others remain (a user reads the answer first;
    back to back, the next turn can reach kvrouterd before the events of the previous one
    are applied)."""
    left = {c: turns for c in range(n_conv)}
    order = []
    recent = []
    while left:
        pick = [c for c in sorted(left) if c not in recent] or sorted(left)
        c = rng.choice(pick)
        recent = (recent + [c])[-2:]
        order.append(c)
        left[c] -= 1
        if not left[c]:
            del left[c]
    return order


def run_conversations(gw, model, seed, n_conv=8, turns=5, on_step=None, chat=False):
    """Sends the workload; returns a list of per-request records (dict)."""
    rng = random.Random(seed)
    convs = [Conversation(random.Random(seed * 1000 + c), c, chat=chat) for c in range(n_conv)]
    out = []
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        for i, c in enumerate(schedule(rng, n_conv, turns)):
            if on_step:
                on_step(i)
            conv = convs[c]
            path, req = conv.next_body(model)
            t0 = time.perf_counter()
            try:
                status, hdr, body = gw.post(path, req, conn=conn)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
                status, hdr, body = gw.post(path, req, conn=conn)
            dt = time.perf_counter() - t0
            rec = {"i": i, "conv": c, "turn": conv.turn, "status": status, "latency": dt,
                   "pod": hdr.get("x-engine-pod"), "prev_pod": conv.last_pod,
                   "hit": int(hdr.get("x-engine-cached-blocks", 0)),
                   "query": int(hdr.get("x-engine-query-blocks", 0)),
                   "route": hdr.get("x-kvr-route")}
            if status == 200:
                conv.answered(json.loads(body), rec["pod"])
            out.append(rec)
    finally:
        conn.close()
    return out


def hit_rate(records, min_turn=2):
    q = sum(r["query"] for r in records if r["turn"] >= min_turn)
    h = sum(r["hit"] for r in records if r["turn"] >= min_turn)
    return h / q if q else 0.0


def stick_rate(records, min_turn=2):
    """Share of follow-up turns that landed on the engine of the previous turn."""
    f = [r for r in records if r["turn"] >= min_turn and r["prev_pod"]]
    return sum(r["pod"] == r["prev_pod"] for r in f) / len(f) if f else 0.0
