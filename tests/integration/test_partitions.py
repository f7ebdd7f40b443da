"""A fleet partitioned by model across two kvrouterd instances ([events] models), behind the
shipped partitioned gateway configurations (deploy/nginx/partitioned.conf,
deploy/haproxy/partitioned.cfg) run by the real nginx and HAProxy.

Each request must be routed by the instance that holds its model (X-Kvr-Route: kvrouterd) to
an engine of that model's pool; a model no pattern names goes round-robin. The instances are
asked without their own engines' events (a route among the candidates the gateway sends is
enough to tell which instance answered: the other one answers 404, and the gateway would
fall back to round-robin). Only the DEPLOY lines are rewritten (ports, paths, budgets).
"""

import http.server
import json
import os
import re
import subprocess
import tempfile
import threading
import time

import pytest

import gwload
from gwload import DEPLOY, free_port
from test_tokenize import bin_sanitized

pytestmark = pytest.mark.skipif(bin_sanitized(), reason="gateway tests run on the release "
                                                         "build (make test)")

QWEN, LLAMA = "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B"


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"engine": self.server.server_address[1]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def engines(n):
    out = []
    for _ in range(n):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        out.append(srv)
    return out


def addr(srv):
    return "127.0.0.1:%d" % srv.server_address[1]


def rewrite(text, subs):
    """Plain replacements (str) and line regexes (R(...)); each must match."""
    for old, new in subs:
        if isinstance(old, str):
            if old not in text:
                raise ValueError("shipped config changed: %r not found" % old)
            text = text.replace(old, new)
        else:
            text, n = old.subn(lambda m: new, text)
            if n == 0:
                raise ValueError("shipped config changed: %r not found" % old.pattern)
    return text


def R(pattern):
    return re.compile(pattern, re.M)


class PartGateway(gwload.Gateway):
    """gwload.Gateway (post, log, close) on a partitioned configuration."""

    def __init__(self, kind, pools, routers):
        self.kind, self.mode = kind, "kvr"
        self.tmp = tempfile.mkdtemp(prefix="kvr-gwp-%s-" % kind)
        os.chmod(self.tmp, 0o755)
        self.port = free_port()
        q, lq = pools["qwen"], pools["llama"]
        subs = [("127.0.0.1:8001", addr(q[0])), ("127.0.0.1:8002", addr(q[1])),
                ("127.0.0.1:8011", addr(lq[0])), ("127.0.0.1:8012", addr(lq[1])),
                ("127.0.0.1:8080", "127.0.0.1:%d" % routers["qwen"].http_port),
                ("127.0.0.1:8090", "127.0.0.1:%d" % routers["llama"].http_port)]
        if kind == "nginx":
            for d in ("body", "proxy"):
                os.makedirs(os.path.join(self.tmp, d))
                os.chmod(os.path.join(self.tmp, d), 0o777)
            with open(os.path.join(DEPLOY, "nginx", "partitioned.conf")) as f:
                conf = rewrite(f.read(), subs + [
                    (R(r"^worker_processes .*;"), "worker_processes 1;"),
                    (R(r"^pid .*;"), "pid %s/nginx.pid;" % self.tmp),
                    (R(r"^error_log .*;"), "error_log %s/error.log info;" % self.tmp),
                    (R(r"^\s*js_path .*;"), "    js_path %s;\n    client_body_temp_path %s/body;\n"
                     "    proxy_temp_path %s/proxy;" % (os.path.join(DEPLOY, "nginx"),
                                                        self.tmp, self.tmp)),
                    (R(r"^\s*listen 8000;"), "        listen 127.0.0.1:%d;" % self.port),
                    ("js_fetch_timeout 20ms;", "js_fetch_timeout 1000ms;")])
            path = os.path.join(self.tmp, "nginx.conf")
            argv = ["nginx", "-p", self.tmp, "-c", path, "-g", "daemon off;"]
        else:
            with open(os.path.join(DEPLOY, "haproxy", "partitioned.cfg")) as f:
                conf = rewrite(f.read(), subs + [
                    (R(r"lua-load \S+"), "lua-load %s" % os.path.join(DEPLOY, "haproxy",
                                                                   "kvrouter.lua")),
                    (R(r"^\s*bind :8000"), "    bind 127.0.0.1:%d" % self.port),
                    ("127.0.0.1:8089", "127.0.0.1:%d" % free_port()),
                    ("127.0.0.1:8088", "127.0.0.1:%d" % free_port()),
                    (" 20 - if", " 1000 - if"),
                    ("timeout connect 20ms", "timeout connect 1000ms"),
                    ("timeout server 20ms", "timeout server 1000ms")])
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


def instance(daemon_factory, models):
    return daemon_factory({"events": {"models": models}, "log": {"level": "info"}})


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_gateway_maps_model_to_its_instance(daemon_factory, kind):
    for tool in ("nginx", "haproxy"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            pytest.fail("%s is not installed (make test installs it)" % tool)
    routers = {"qwen": instance(daemon_factory, "Qwen/*"),
               "llama": instance(daemon_factory, "meta-llama/*")}
    pools = {"qwen": engines(2), "llama": engines(2)}
    ports = {k: {p.server_address[1] for p in v} for k, v in pools.items()}
    gw = PartGateway(kind, pools, routers)
    try:
        if kind == "haproxy":  # its health checks must have seen both instances up
            time.sleep(1.2)
        tokens = list(range(1, 65))
        for key, model in (("qwen", QWEN), ("llama", LLAMA)):
            for _ in range(4):
                status, hdr, body = gw.post("/v1/completions",
                                            {"model": model, "token_ids": tokens,
                                             "max_tokens": 1})
                assert status == 200, (status, body, gw.log())
                assert hdr.get("x-kvr-route") == "kvrouterd", (model, hdr, gw.log())
                assert json.loads(body)["engine"] in ports[key], (model, body)
        # each instance answered its own model only: the other one would have said 404
        for key in ("qwen", "llama"):
            status, body = routers[key].json("POST", "/v1/route", {
                "model": LLAMA if key == "qwen" else QWEN, "token_ids": tokens,
                "candidates": [{"pod": "127.0.0.1:1"}]})
            assert status == 404, body
        # a model no pattern names: round-robin over the default pool, never an error
        status, hdr, body = gw.post("/v1/completions", {"model": "other/x", "token_ids": tokens})
        assert status == 200 and hdr.get("x-kvr-route") == "round-robin", (hdr, gw.log())
        assert json.loads(body)["engine"] in ports["qwen"]
    finally:
        gw.close()
        for pool in pools.values():
            for srv in pool:
                srv.shutdown()
