"""The engines' own load end to end: the real kvrouterd scrapes Python HTTP servers that serve
vLLM- and SGLang-shaped /metrics ([load] metrics_url), and shows what it read in GET /v1/pods
("load") and GET /metrics (kvrouter_load_*).

Targets come from the KV-event streams (vllm_pub engines whose pod id is the metrics server's
host:port, the shipped gateways' convention) or from [model] approximate_pods. Covered: values
that change show up within a few intervals, per DP rank (vLLM's engine label, or one URL per
rank with {rank}); a server that closes or stalls past metrics_timeout is counted and its
worker turns stale while its last values stay; an answer over max_response_bytes (with and
without Content-Length), a 500 and an answer without any known series are refused and
counted; pod ids that cannot go into a URL, and targets and workers past max_targets, are
refused; SIGHUP turns scraping on, changes its URL and turns it off; the samples reach
[route] (ttft skips a worker whose engine reports a long queue, and follows when the queues
change). Loopback only; every wait is bounded.
"""

import http.server
import re
import socket
import threading
import time

import pytest

from kvrharness import render_config
from test_ingest import metric, need_http, wait_pod
from vllm_pub import Engine, tokens_for

MODEL = "test/load"
WAIT = 10.0


def vllm_text(ranks):
    """A vLLM V1 /metrics answer: ranks = {engine index: (waiting, running, kv_usage)}."""
    out = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
           "# TYPE vllm:num_requests_running gauge"]
    for e, (_, r, _) in sorted(ranks.items()):
        out.append('vllm:num_requests_running{model_name="%s",engine="%d"} %.1f' % (MODEL, e, r))
    out += ["# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge"]
    for e, (w, _, _) in sorted(ranks.items()):
        out.append('vllm:num_requests_waiting{model_name="%s",engine="%d"} %.1f' % (MODEL, e, w))
    out += ["# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge"]
    for e, (_, _, u) in sorted(ranks.items()):
        out.append('vllm:kv_cache_usage_perc{model_name="%s",engine="%d"} %r' % (MODEL, e, u))
    out += ["# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram"]
    for le in ("0.01", "0.1", "1.0", "+Inf"):
        out.append('vllm:time_to_first_token_seconds_bucket{engine="0",le="%s",model_name="%s"} 3.0'
                   % (le, MODEL))
    return "\n".join(out) + "\n"


class MetricsServer:
    """A /metrics server on 127.0.0.1:0 whose answer a test changes while it runs.

    mode: "ok" (200 with `body`, Content-Length), "stall" (headers never come: the handler
    waits until released, at most 10 s), "status" (500), "big" (200 with `body` * 4000, with
    Content-Length), "bigstream" (the same without Content-Length: HTTP/1.0, until close).
    `paths` maps a path to its own body (per-rank URLs); hits counts requests."""

    def __init__(self, body=""):
        self.body = body
        self.paths = {}
        self.mode = "ok"
        self.hits = 0
        self.conns = set()  # open keep-alive connections (closed with the server)
        self.nconns = 0     # connections accepted
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                server.conns.add(self.connection)
                server.nconns += 1

            def finish(self):
                server.conns.discard(self.connection)
                super().finish()

            def do_GET(self):
                server.hits += 1
                mode = server.mode
                if mode == "stall":
                    server.release.wait(10)
                    self.close_connection = True
                    return
                if mode == "status":
                    data = b"engine overloaded\n"
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                body = server.paths.get(self.path, server.body)
                data = body.encode() * (4000 if mode in ("big", "bigstream") else 1)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                if mode == "bigstream":
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass  # the scraper hung up (too large)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.pod = "127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.open = True

    def close(self):
        """Stops like an engine that exits: the listener and every open connection close."""
        if self.open:
            self.open = False
            self.release.set()
            self.httpd.shutdown()
            self.httpd.server_close()
            for c in list(self.conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.thread.join(5)


@pytest.fixture
def servers():
    made = []

    def make(body=""):
        s = MetricsServer(body)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def load_cfg(url="http://{pod}/metrics", approx=None, **kw):
    load = {"metrics_url": url, "metrics_interval": "20ms", "metrics_timeout": "300ms",
            "stale_after": "400ms"}
    load.update(kw)
    cfg = {"load": load}
    if approx:
        cfg['model "%s"' % MODEL] = {"approximate_pods": ", ".join(approx)}
    return cfg


def engine_for(d, pod, dp_size=1):
    """An engine publishing KV events as pod (each rank's stream known to the daemon)."""
    eng = Engine(pod=pod, model=MODEL, mode="connect", endpoints=[d.events[0]] * dp_size,
                 dp_size=dp_size)
    eng.wait_subscriber()
    for r in range(dp_size):
        wait_pod(d, pod, r, seq=eng.rank(r).publish())
    return eng


def wait_load(d, pod, rank=0, pred=lambda l: True, timeout=WAIT):
    """Waits until /v1/pods shows a "load" for the stream (pod, rank) that satisfies pred."""
    holder = {}

    def ok(entry):
        holder["last"] = entry.get("load")
        return "load" in entry and pred(entry["load"])

    try:
        return wait_pod(d, pod, rank, pred=ok, timeout=timeout)["load"]
    except AssertionError:
        raise AssertionError("no load for %s/%d matching; last %r" % (pod, rank, holder.get("last")))


def wait_metric(d, name, labels=None, pred=lambda v: v is not None and v > 0, timeout=WAIT):
    deadline = time.monotonic() + timeout
    v = None
    while time.monotonic() < deadline:
        v = metric(d, name, labels)
        if pred(v):
            return v
        time.sleep(0.02)
    raise AssertionError("kvrouter_%s{%s} never matched; last %r; stderr tail:\n%s"
                         % (name, labels or "", v, d.stderr_text()[-3000:]))


def worker_labels(pod, rank=0):
    return 'pod="%s",dp_rank="%d"' % (pod, rank)


def test_stream_loads_follow_the_engine(daemon_factory, servers):
    srv = servers(vllm_text({0: (3, 7, 0.5), 1: (0, 2, 0.125)}))
    d = daemon_factory(load_cfg())
    need_http(d)
    eng = engine_for(d, srv.pod, dp_size=2)
    try:
        l0 = wait_load(d, srv.pod, 0, lambda l: l["waiting"] == 3)
        assert l0["running"] == 7 and l0["kv_usage"] == 0.5 and l0["stale"] is False
        assert 0 <= l0["age_ms"] < 5000
        l1 = wait_load(d, srv.pod, 1, lambda l: l["running"] == 2)
        assert l1["waiting"] == 0 and l1["kv_usage"] == 0.125
        # the engine's queue grows: seen within a few intervals
        srv.body = vllm_text({0: (9, 8, 0.75), 1: (4, 2, 0.25)})
        l0 = wait_load(d, srv.pod, 0, lambda l: l["waiting"] == 9)
        assert l0["running"] == 8 and l0["kv_usage"] == 0.75
        wait_load(d, srv.pod, 1, lambda l: l["waiting"] == 4)
        # /metrics: the same figures, the scrapes and the one target
        assert metric(d, "load_waiting_requests", worker_labels(srv.pod, 0)) == 9
        assert metric(d, "load_kv_cache_usage_ratio", worker_labels(srv.pod, 1)) == 0.25
        assert metric(d, "load_stale", worker_labels(srv.pod, 0)) == 0
        assert metric(d, "load_scrapes_total", 'result="ok"') >= 2
        assert metric(d, "load_targets") == 1
        assert metric(d, "load_malformed_lines_total") == 0
        # one URL for both ranks, its connection kept alive between scrapes
        deadline = time.monotonic() + WAIT
        while srv.hits < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.hits >= 20 and srv.nconns <= 2, (srv.hits, srv.nconns)
    finally:
        eng.close()


def test_stopped_engine_turns_stale_and_keeps_its_values(daemon_factory, servers):
    srv = servers(vllm_text({0: (5, 1, 0.25)}))
    d = daemon_factory(load_cfg())
    need_http(d)
    eng = engine_for(d, srv.pod)
    try:
        wait_load(d, srv.pod, 0, lambda l: l["waiting"] == 5 and not l["stale"])
        srv.close()  # the engine's HTTP server is gone: connections are refused
        l0 = wait_load(d, srv.pod, 0, lambda l: l["stale"])
        assert l0["waiting"] == 5 and l0["running"] == 1  # the last known values stay
        assert l0["age_ms"] >= 400
        wait_metric(d, "load_scrapes_total", 'result="connect"')
        wait_metric(d, "load_targets_stale", None, lambda v: v == 1)
        assert metric(d, "load_stale", worker_labels(srv.pod, 0)) == 1
        assert re.search(r"load: scraping http://%s/metrics failed: connect" % re.escape(srv.pod),
                         d.stderr_text())
    finally:
        eng.close()


def test_stalling_engine_times_out(daemon_factory, servers):
    srv = servers(vllm_text({0: (2, 2, 0.5)}))
    d = daemon_factory(load_cfg(approx=[srv.pod]))
    need_http(d)
    labels = worker_labels(srv.pod, 0)
    wait_metric(d, "load_waiting_requests", labels, lambda v: v == 2)
    srv.mode = "stall"
    wait_metric(d, "load_stale", labels, lambda v: v == 1)
    wait_metric(d, "load_scrapes_total", 'result="timeout"')
    assert metric(d, "load_waiting_requests", labels) == 2
    # the engine answers again: fresh values, no longer stale
    srv.body = vllm_text({0: (6, 2, 0.5)})
    srv.mode = "ok"
    srv.release.set()
    wait_metric(d, "load_waiting_requests", labels, lambda v: v == 6)
    wait_metric(d, "load_stale", labels, lambda v: v == 0)
    d.wait_log(r"load: http://%s/metrics answers again" % re.escape(srv.pod))


@pytest.mark.parametrize("mode", ["big", "bigstream"])
def test_oversized_answer_is_refused(daemon_factory, servers, mode):
    srv = servers(vllm_text({0: (1, 1, 0.5)}))  # * 4000: ~3 MB against a 64 KiB limit
    srv.mode = mode
    d = daemon_factory(load_cfg(approx=[srv.pod], max_response_bytes="64KiB"))
    need_http(d)
    wait_metric(d, "load_scrapes_total", 'result="too_large"', lambda v: v is not None and v >= 3)
    assert metric(d, "load_scrapes_total", 'result="ok"') == 0
    assert metric(d, "load_waiting_requests", worker_labels(srv.pod, 0)) is None
    assert "answer over max_response_bytes" in d.stderr_text()
    # the same answer once small enough is read
    srv.mode = "ok"
    wait_metric(d, "load_waiting_requests", worker_labels(srv.pod, 0), lambda v: v == 1)


def test_bad_answers_are_counted(daemon_factory, servers):
    status = servers(vllm_text({0: (1, 1, 0.5)}))
    status.mode = "status"
    junk = servers("# HELP unrelated_total Nothing a router reads.\nunrelated_total 1\n"
                   "vllm:num_requests_waiting{engine=\"0\" 3\n")
    d = daemon_factory(load_cfg(approx=[status.pod, junk.pod, "bad/pod:1", "user@evil:80"]))
    need_http(d)
    wait_metric(d, "load_scrapes_total", 'result="http_status"')
    wait_metric(d, "load_scrapes_total", 'result="parse"')
    wait_metric(d, "load_malformed_lines_total")
    wait_metric(d, "load_targets_refused", 'reason="bad_pod"', lambda v: v == 2)
    assert metric(d, "load_targets") == 2
    assert metric(d, "load_scrapes_total", 'result="ok"') == 0
    assert "HTTP status 500" in d.stderr_text()


def test_rank_template_scrapes_one_url_per_rank(daemon_factory, servers):
    srv = servers("")
    # SGLang-shaped answers without a dp_rank label: the URL says which rank it is
    srv.paths = {"/metrics/0": "sglang:num_queue_reqs{model_name=\"m\"} 11\n"
                               "sglang:num_running_reqs{model_name=\"m\"} 1\n"
                               "sglang:token_usage{model_name=\"m\"} 0.5\n",
                 "/metrics/1": "sglang:num_queue_reqs{model_name=\"m\"} 22\n"
                               "sglang:num_running_reqs{model_name=\"m\"} 2\n"
                               "sglang:token_usage{model_name=\"m\"} 0.25\n"}
    d = daemon_factory(load_cfg(url="http://{pod}/metrics/{rank}"))
    need_http(d)
    eng = engine_for(d, srv.pod, dp_size=2)
    try:
        wait_load(d, srv.pod, 0, lambda l: l["waiting"] == 11 and l["kv_usage"] == 0.5)
        wait_load(d, srv.pod, 1, lambda l: l["waiting"] == 22 and l["running"] == 2)
        assert metric(d, "load_targets") == 2
    finally:
        eng.close()


def test_reload_turns_scraping_on_changes_and_off(daemon_factory, servers):
    a = servers(vllm_text({0: (1, 0, 0.5)}))
    b = servers(vllm_text({0: (2, 0, 0.5)}))
    cfg = {'model "%s"' % MODEL: {"approximate_pods": a.pod}}
    d = daemon_factory(cfg)
    need_http(d)
    labels = worker_labels(a.pod, 0)
    time.sleep(0.2)
    assert a.hits == 0 and metric(d, "load_targets") == 0  # off by default

    def rewrite(extra):
        merged = dict(d.config)
        merged.update(extra)
        with open(d.conf_path, "w") as f:
            f.write(render_config(merged))
        m = d.reload()
        assert m.group(1) == "ok", m.group(0)

    rewrite(load_cfg(approx=[a.pod]))
    wait_metric(d, "load_waiting_requests", labels, lambda v: v == 1)
    # another URL template: the engine serves its metrics on another port now
    rewrite(load_cfg(url="http://{host}:%d/metrics" % b.port, approx=[a.pod]))
    wait_metric(d, "load_waiting_requests", labels, lambda v: v == 2)
    hits = a.hits
    # off again: targets and workers go, nothing is asked any more
    rewrite(load_cfg(url="", approx=[a.pod]))
    wait_metric(d, "load_targets", None, lambda v: v == 0)
    wait_metric(d, "load_waiting_requests", labels, lambda v: v is None)
    before = b.hits
    time.sleep(0.2)
    assert b.hits - before <= 1 and a.hits == hits


def test_scraped_loads_move_route_decisions(daemon_factory, servers):
    """The daemon hands the scraped samples to [route] (kvr_daemon_route_load): with ttft and
    busy_waiting, the worker whose engine reports a long queue is skipped, and the choice
    follows when the queues change."""
    a = servers(vllm_text({0: (50, 8, 0.5)}))
    b = servers(vllm_text({0: (0, 1, 0.25)}))
    cfg = load_cfg(approx=[a.pod, b.pod])
    cfg['model "%s"' % MODEL]["block_size"] = "16"
    cfg["route"] = {"policy": "ttft", "busy_waiting": "10", "seed": "3"}
    d = daemon_factory(cfg)
    need_http(d)
    wait_metric(d, "load_waiting_requests", worker_labels(a.pod), lambda v: v == 50)
    wait_metric(d, "load_waiting_requests", worker_labels(b.pod), lambda v: v == 0)

    def decide(seed):
        st, res = d.json("POST", "/v1/route", {"model": MODEL, "token_ids": tokens_for(seed, 64)})
        assert st == 200, res
        return res

    for seed in range(3):
        res = decide(seed)
        assert res["pod"] == b.pod, res
        cands = {c["pod"]: c for c in res["candidates"]}
        assert cands[a.pod].get("busy") is True and cands[a.pod]["kv_usage"] == 0.5, res
        assert not cands[b.pod].get("busy"), res
    a.body = vllm_text({0: (0, 1, 0.25)})
    b.body = vllm_text({0: (60, 8, 0.5)})
    wait_metric(d, "load_waiting_requests", worker_labels(b.pod), lambda v: v == 60)
    wait_metric(d, "load_waiting_requests", worker_labels(a.pod), lambda v: v == 0)
    for seed in range(10, 13):
        assert decide(seed)["pod"] == a.pod


def test_max_targets(daemon_factory, servers):
    """Past [load] max_targets, URLs are refused (a gauge) and so are workers (a counter)."""
    a = servers(vllm_text({0: (1, 0, 0.5), 1: (1, 0, 0.5)}))
    b = servers(vllm_text({0: (2, 0, 0.5), 1: (2, 0, 0.5)}))  # whichever is kept: two ranks
    d = daemon_factory(load_cfg(approx=[a.pod, b.pod], max_targets="1"))
    need_http(d)
    wait_metric(d, "load_targets_refused", 'reason="too_many"', lambda v: v == 1)
    assert metric(d, "load_targets") == 1
    # the one target kept answers for two ranks: the second worker is one too many
    wait_metric(d, "load_workers_refused_total")
    waiting = [metric(d, "load_waiting_requests", worker_labels(p, r))
               for p in (a.pod, b.pod) for r in (0, 1)]
    assert sum(v is not None for v in waiting) == 1, waiting
