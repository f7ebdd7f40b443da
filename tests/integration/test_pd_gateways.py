"""Disaggregated prefill and decode through the shipped gateways, for real: nginx (njs) and
HAProxy (Lua) forward a completion to the decode engine kvrouterd chose, with
`x-prefiller-host-port` naming the prefill engine (llm-d's header, which its routing sidecar
on the decode pod reads), when kvrouterd splits the request; a short prompt goes to a decode
engine without it; a client's own x-prefiller-host-port never passes. The gateways list only
the decode engines (where they forward); kvrouterd adds the model's prefill pool. The engines
are HTTP servers that record what they receive. Loopback only; bounded waits.
"""

import http.client
import http.server
import json
import shutil
import threading

import pytest

import gwload
from kvrharness import free_port
from test_ingest import need_http
from test_tokenize import bin_sanitized
from vllm_pub import tokens_for

pytestmark = pytest.mark.skipif(bin_sanitized(), reason="gateway tests run on the release "
                                                         "build (make test)")
MODEL = "test/pd"


class Engine:
    """An OpenAI-shaped engine that records each request's headers (seen) and body (bodies).
    As a vLLM prefill engine with a KV connector (prefill=True), it answers a request asking
    for a remote decode with the kv_transfer_params a decode engine needs; status: what it
    answers."""

    def __init__(self, prefill=False, status=200):
        self.seen, self.bodies, self.status = [], [], status
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                req = json.loads(self.rfile.read(n) or b"null")
                outer.seen.append({k.lower(): v for k, v in self.headers.items()})
                outer.bodies.append(req)
                ans = {"choices": [{"text": "ok from %s" % outer.addr}]}
                ktp = isinstance(req, dict) and req.get("kv_transfer_params")
                if prefill and ktp and ktp.get("do_remote_decode"):
                    ans["kv_transfer_params"] = {
                        "do_remote_prefill": True, "do_remote_decode": False,
                        "remote_engine_id": "engine-" + outer.addr, "remote_block_ids": [1, 2],
                        "remote_host": "127.0.0.1", "remote_port": 5600,
                        "request_id": self.headers.get("x-request-id")}
                body = json.dumps(ans).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.addr = "127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_gateway_carries_the_pair(daemon_factory, kind):
    for tool in ("nginx", "haproxy"):
        if shutil.which(tool) is None:
            pytest.fail("%s is not installed: `make test` installs it" % tool)
    dec = [Engine(), Engine()]
    prefill = ["127.0.0.1:%d" % free_port(), "127.0.0.1:%d" % free_port()]  # never called
    d = daemon_factory({'model "%s"' % MODEL: {"prefill_pods": " ".join(prefill),
                                               "decode_pods": " ".join(e.addr for e in dec),
                                               "block_size": "16"},
                        "route": {"policy": "ttft", "seed": "5"}})
    need_http(d)
    gw = gwload.Gateway(kind, [e.addr for e in dec], d.url("/v1/route"), fetch_timeout_ms=2000)
    try:
        for seed in range(4):  # long prompts: split
            st, hdrs, _ = gw.post("/v1/completions", {"model": MODEL,
                                                      "prompt": tokens_for(seed, 4096)})
            assert st == 200 and hdrs.get("x-kvr-route") == "kvrouterd", (st, hdrs, gw.log())
        heads = [h.get("x-prefiller-host-port") for e in dec for h in e.seen]
        assert len(heads) == 4 and all(h in prefill for h in heads), heads
        assert len(set(heads)) == 2, heads  # the prefill load spreads
        for e in dec:
            e.seen.clear()
        # short: the decode engine alone; a client's header is dropped
        st, _, _ = gw.post("/v1/completions", {"model": MODEL, "prompt": tokens_for(50, 64)})
        assert st == 200
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": MODEL, "prompt": tokens_for(51, 64)}),
                     headers={"Content-Type": "application/json",
                              "x-prefiller-host-port": "10.9.9.9:1"})
        assert conn.getresponse().status == 200
        conn.close()
        heads = [h.get("x-prefiller-host-port") for e in dec for h in e.seen]
        assert heads == [None, None], heads
    finally:
        gw.close()
        for e in dec:
            e.close()


def test_nginx_vllm_two_calls(daemon_factory):
    """$kvr_pd_mode "vllm": nginx makes vLLM's proxy calls itself: a one-token prefill with
    kv_transfer_params on the prefill engine kvrouterd chose, then the client's request with
    the prefill's kv_transfer_params on the decode engine; a failed prefill leaves the
    request to the decode engine alone."""
    if shutil.which("nginx") is None:
        pytest.fail("nginx is not installed: `make test` installs it")
    dec = [Engine(), Engine()]
    pre = [Engine(prefill=True), Engine(prefill=True)]
    d = daemon_factory({'model "%s"' % MODEL: {"prefill_pods": " ".join(e.addr for e in pre),
                                               "decode_pods": " ".join(e.addr for e in dec),
                                               "block_size": "16"},
                        "route": {"policy": "ttft", "seed": "5"}})
    need_http(d)
    gw = gwload.Gateway("nginx", [e.addr for e in dec], d.url("/v1/route"),
                        fetch_timeout_ms=2000, pd_mode="vllm")
    try:
        for seed in range(4):  # long prompts: split, two calls each
            body = {"model": MODEL, "prompt": tokens_for(seed, 4096), "max_tokens": 40,
                    "min_tokens": 5, "stream": seed % 2 == 1, "user": "u%d" % seed}
            if body["stream"]:
                body["stream_options"] = {"include_usage": True}
            st, hdrs, data = gw.post("/v1/completions", body,
                                     headers={"X-Request-Id": "req-%d" % seed})
            assert st == 200 and hdrs.get("x-kvr-route") == "kvrouterd", (st, hdrs, gw.log())
            p = [(e, b, h) for e in pre for b, h in zip(e.bodies, e.seen)]
            q = [(e, b, h) for e in dec for b, h in zip(e.bodies, e.seen)]
            assert len(p) == 1 and len(q) == 1, (len(p), len(q), gw.log())
            pe, pb, ph = p[0]
            de, db, dh = q[0]
            # the prefill call: one token, not streamed, asking for a remote decode
            want = dict(body, max_tokens=1, stream=False,
                        kv_transfer_params={"do_remote_decode": True,
                                            "do_remote_prefill": False,
                                            "remote_engine_id": None,
                                            "remote_block_ids": None,
                                            "remote_host": None, "remote_port": None})
            for k in ("min_tokens", "stream_options"):
                want.pop(k, None)
            assert pb == want, pb
            # the decode call: the client's body and the prefill's answer's parameters
            assert db == dict(body, kv_transfer_params={
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": "engine-" + pe.addr, "remote_block_ids": [1, 2],
                "remote_host": "127.0.0.1", "remote_port": 5600,
                "request_id": "req-%d" % seed}), db
            assert ph.get("x-request-id") == dh.get("x-request-id") == "req-%d" % seed
            assert "x-prefiller-host-port" not in dh
            assert json.loads(data)["choices"][0]["text"] == "ok from " + de.addr
            for e in pre + dec:
                e.seen.clear()
                e.bodies.clear()
        # without a client id, nginx's own: one id for both calls
        st, _, _ = gw.post("/v1/completions", {"model": MODEL, "prompt": tokens_for(9, 4096)})
        ids = [h.get("x-request-id") for e in pre + dec for h in e.seen]
        assert st == 200 and len(ids) == 2 and ids[0] and ids[0] == ids[1], ids
        for e in pre + dec:
            e.seen.clear()
            e.bodies.clear()
        # short: the decode engine alone, no prefill call
        st, _, _ = gw.post("/v1/completions", {"model": MODEL, "prompt": tokens_for(50, 64)})
        assert st == 200 and sum(len(e.bodies) for e in pre) == 0
        assert [b.get("kv_transfer_params") for e in dec for b in e.bodies] == [None]
        for e in dec:
            e.bodies.clear()
        # the prefill engines fail: the decode engine serves the client's body unchanged
        for e in pre:
            e.status = 500
        body = {"model": MODEL, "prompt": tokens_for(60, 4096), "max_tokens": 7}
        st, hdrs, _ = gw.post("/v1/completions", body)
        assert st == 200 and sum(len(e.bodies) for e in pre) == 1, gw.log()
        assert [b for e in dec for b in e.bodies] == [body]
        assert "decode engine alone (prefill engine HTTP 500)" in gw.log()
    finally:
        gw.close()
        for e in pre + dec:
            e.close()
