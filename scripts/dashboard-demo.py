#!/usr/bin/python3
"""Renders the Grafana dashboard's main panels from a short real run into a PNG
(docs/dashboard.png), so that a reader sees what the dashboard shows.

A real kvrouterd (build/kvrouterd) and four emulated vLLM engines (tests/integration/
vllm_pub.py: each a real ZeroMQ publisher with a replay ROUTER and an LRU prefix cache, plus a
/metrics server with vllm:num_requests_*, vllm:kv_cache_usage_perc and
vllm:prefix_cache_{hits,queries}_total counted from that cache); a load generator routes
requests with shared system prompts through POST /v1/route (token ids, and prompts through
the qwen3 tokenizer when build/tokref has it) and runs each on the engine chosen, which then
publishes its KV events. Midway one engine's batches are lost for a while, so its stream
replays (slowly) and the recovery panels move. A real Prometheus server
(build/tools/prometheus, from Debian's prometheus package: `sh scripts/promtool-fetch.sh
build/tools/prometheus prometheus`) scrapes kvrouterd and the engines every second; at the
end the dashboard's own PromQL (deploy/grafana/kvrouterd.json, Grafana's variables
substituted) is run through its query_range API and drawn with matplotlib
(python3-matplotlib: a dev tool for this script only, not a test dependency).

    /usr/bin/python3 scripts/dashboard-demo.py [--seconds 120] [--out docs/dashboard.png]

Takes about --seconds plus 15 s, on 2 cores.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

from kvrharness import Daemon  # noqa: E402
from test_load import MetricsServer  # noqa: E402
from vllm_pub import Engine, tokens_for  # noqa: E402

MODEL = "demo/qwen3"
BS = 16
NENGINES = 4
# The panels drawn: (dashboard panel title, y-axis label)
PANELS = [
    ("Requests/s by endpoint", "req/s"),
    ("Decision latency p50 / p99 by input", "seconds"),
    ("Predicted hit rate (block-weighted)", "ratio"),
    ("Chosen vs best cached", "ratio"),
    ("Decisions by branch", "decisions/s"),
    ("Share of decisions per worker", "share"),
    ("Predicted vs engine cache hits (tokens/s)", "tokens/s"),
    ("Per-worker load", ""),
    ("Events/s by type", "events/s"),
    ("Stream states", "streams"),
    ("Recovery: replays in progress", ""),
    ("Memory vs cap", "bytes"),
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def engine_metrics(st):
    lines = []
    for name, kind, v in (("vllm:num_requests_waiting", "gauge", st["waiting"]),
                          ("vllm:num_requests_running", "gauge", st["running"]),
                          ("vllm:kv_cache_usage_perc", "gauge", st["usage"]),
                          ("vllm:prefix_cache_hits_total", "counter", st["hits"]),
                          ("vllm:prefix_cache_queries_total", "counter", st["queries"])):
        lines += ["# TYPE %s %s" % (name, kind),
                  '%s{model_name="%s",engine="0"} %r' % (name, MODEL, float(v))]
    return "\n".join(lines) + "\n"


class Fleet:
    def __init__(self):
        self.servers = [MetricsServer("") for _ in range(NENGINES)]
        self.engines = [Engine(pod=s.pod, model=MODEL, mode="bind", replay=True,
                               block_size=BS, num_blocks=3000) for s in self.servers]
        self.state = [{"waiting": 0, "running": 0, "usage": 0.0, "hits": 0, "queries": 0,
                       "busy_until": []} for _ in range(NENGINES)]
        self.lock = threading.Lock()
        self.publish()

    def publish(self):
        for s, st in zip(self.servers, self.state):
            s.body = engine_metrics(st)

    def run(self, i, tokens):
        """The request on engine i: its prefix cache says what was cached; events go out."""
        r = self.engines[i].rank(0)
        with self.lock:
            hit, _, _ = r.request(tokens)
            r.publish()
            st = self.state[i]
            st["hits"] += hit * BS
            st["queries"] += len(tokens)
            now = time.monotonic()
            # a request runs for a while: longer when less of it was cached
            st["busy_until"] = [t for t in st["busy_until"] if t > now]
            st["busy_until"].append(now + 0.2 + 0.004 * (len(tokens) - hit * BS) / BS)
            n = len(st["busy_until"])
            st["running"] = min(n, 8)
            st["waiting"] = max(0, n - 8)
            # blocks held by running requests (cached free blocks do not count, as in vLLM)
            st["usage"] = min(1.0, n * 40.0 / len(r.cache.blocks))
            self.publish()

    def close(self):
        for e in self.engines:
            e.close()
        for s in self.servers:
            s.close()


def load(d, fleet, seconds, have_tok, stop):
    rnd = random.Random(7)
    systems = [tokens_for(100 + k, BS * rnd.randint(8, 40)) for k in range(24)]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(len(systems))]
    pods = [e.pod for e in fleet.engines]
    t0 = time.monotonic()
    n = 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        phase = (time.monotonic() - t0) / seconds
        rate = 40 if phase < 0.6 else 70  # a step up in traffic
        sysp = rnd.choices(systems, weights)[0]
        if have_tok and rnd.random() < 0.15:
            body = {"model": MODEL, "prompt": "System: be brief. " * 40 +
                    "Question %d: what is %d + %d?" % (n, rnd.randint(1, 99), rnd.randint(1, 99))}
        else:
            body = {"model": MODEL, "token_ids": sysp + tokens_for(10 ** 6 + n,
                                                                  BS * rnd.randint(1, 12) + 5)}
        toks = body.get("token_ids")
        if toks is None:  # the engine runs the ids the prompt makes (as vLLM would)
            st, res = d.json("POST", "/v1/tokenize", body)
            toks = res["tokens"] if st == 200 else None
        st, res = d.json("POST", "/v1/route", body)
        if st == 200 and toks:
            i = pods.index(res["pod"])
            threading.Thread(target=fleet.run, args=(i, toks), daemon=True).start()
        if rnd.random() < 0.2:
            d.json("POST", "/v1/score", {"model": MODEL, "token_ids": sysp})
        n += 1
        time.sleep(rnd.expovariate(rate))
    return n


def prom_config(path, admin_port, fleet):
    lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s", "scrape_configs:",
             "  - job_name: kvrouterd", "    static_configs:",
             "      - targets: ['127.0.0.1:%d']" % admin_port,
             "  - job_name: vllm", "    static_configs:"]
    for s in fleet.servers:
        lines += ["      - targets: ['%s']" % s.pod, "        labels: {pod: '%s'}" % s.pod]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def query_range(port, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/query_range?%s" % (port, q),
                                timeout=30) as r:
        res = json.load(r)
    assert res["status"] == "success", res
    return res["data"]["result"]


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{%s}}" % k, v)
    return out.replace("{{", "").replace("}}", "") or "value"


def render(port, start, end, out, rate_interval):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(REPO, "deploy", "grafana", "kvrouterd.json")) as f:
        dash = json.load(f)
    by_title = {p["title"]: p for p in dash["panels"]}
    fig, axes = plt.subplots(4, 3, figsize=(15, 13))
    for ax, (title, ylabel) in zip(axes.flat, PANELS):
        p = by_title[title]
        unit = p["fieldConfig"]["defaults"].get("unit")
        for t in p["targets"]:
            expr = (t["expr"].replace("$__rate_interval", rate_interval)
                    .replace("$instance", ".*").replace("$model", ".*"))
            for series in query_range(port, expr, start, end, 2):
                xs = [float(v[0]) - start for v in series["values"]]
                ys = [float(v[1]) for v in series["values"]]
                lab = legend(t.get("legendFormat", ""), series["metric"])
                if not title.startswith("Recovery") and not any(y == y and y != 0 for y in ys):
                    continue  # a branch never taken, an endpoint never called: no line
                ax.plot(xs, ys, linewidth=1.2, label=lab,
                        linestyle="--" if lab.startswith("engine") else "-")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        if unit == "percentunit":
            ax.set_ylim(0, 1.05)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=6, loc="best", ncol=2 if len(handles) > 4 else 1)
    fig.suptitle("kvrouterd dashboard (deploy/grafana/kvrouterd.json), main panels: a %d s run, "
                 "4 emulated engines, scraped by Prometheus every 1 s" % round(end - start),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=72)
    print("wrote %s" % out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "dashboard.png"))
    ap.add_argument("--prometheus", default=os.path.join(REPO, "build", "tools", "prometheus"))
    args = ap.parse_args()
    if not os.access(args.prometheus, os.X_OK):
        sys.exit("no %s: sh scripts/promtool-fetch.sh %s prometheus"
                 % (args.prometheus, args.prometheus))
    tokref = os.path.join(REPO, "build", "tokref", "qwen3")
    have_tok = os.path.exists(os.path.join(tokref, "tokenizer.json"))
    tmp = tempfile.mkdtemp(prefix="kvr-demo-")
    fleet = Fleet()
    cfg = {"log": {"level": "info"},
           "events": {"bind": None, "replay_timeout": "60s",
                      "connect": ["%s replay=%s" % (e.rank(0).pub_endpoint,
                                                     e.rank(0).replay_endpoint)
                                  for e in fleet.engines]},
           "state": {"dir": os.path.join(tmp, "state"), "snapshot_interval": "10s"},
           "load": {"metrics_url": "http://{pod}/metrics", "metrics_interval": "500ms"},
           "index": {"max_memory": "64MiB"}}
    if have_tok:
        cfg['model "%s"' % MODEL] = {"tokenizer": tokref}
    d = Daemon(config=cfg, ready_timeout=60)
    prom = None
    stop = threading.Event()
    try:
        for e in fleet.engines:  # each stream known (an empty batch)
            e.wait_subscriber()
            e.rank(0).publish()
        pport = free_port()
        prom_config(os.path.join(tmp, "prometheus.yml"), d.admin_port, fleet)
        prom = subprocess.Popen([args.prometheus, "--config.file", os.path.join(tmp, "prometheus.yml"),
                                 "--storage.tsdb.path", os.path.join(tmp, "tsdb"),
                                 "--web.listen-address", "127.0.0.1:%d" % pport],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        start = time.time()

        def lose_batches():  # midway: 8 batches of one engine are lost; its replay is slow
            time.sleep(args.seconds * 0.45)
            r = fleet.engines[1].rank(0)
            with fleet.lock:
                r.replay_delay = 0.6
                r.drop = set(range(r.seq, r.seq + 8))
        threading.Thread(target=lose_batches, daemon=True).start()
        n = load(d, fleet, args.seconds, have_tok, stop)
        time.sleep(3)
        end = time.time()
        print("%d requests in %.0f s" % (n, end - start))
        # kvrouterd's predicted hit tokens per worker beside the engines' own counters
        for e, s in zip(fleet.engines, fleet.state):
            got = query_range(pport, 'kvrouter_decision_worker_matched_tokens_total{pod="%s"}'
                              % e.pod, end, end, 1)
            pred = float(got[0]["values"][-1][1]) if got else 0
            print("%s: predicted hit tokens %d, engine prefix_cache_hits %d, queries %d"
                  % (e.pod, pred, s["hits"], s["queries"]))
        render(pport, start, end, args.out, "10s")
    finally:
        stop.set()
        if prom is not None:
            prom.send_signal(signal.SIGTERM)
            prom.wait(20)
        problems = d.finish()
        fleet.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if problems:
            print("\n".join(problems)[:3000])


if __name__ == "__main__":
    main()
