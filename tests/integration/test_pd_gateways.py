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
    """An OpenAI-shaped engine that records each request's headers."""

    def __init__(self):
        self.seen = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                outer.seen.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps({"choices": [{"text": "ok"}]}).encode()
                self.send_response(200)
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
