"""gateways_bench — the shipped nginx and HAProxy gateways with kvrouterd vs round-robin.

Why: a gateway that asks kvrouterd pays one HTTP call per request; this shows what that
costs (requests/s, latency p50/p99 through the gateway, with kvrouterd vs the same gateway
doing round-robin) and what it buys (the engines' prefix-cache hit rate on a replay of the
Mooncake trace's conversations). Run by bench/gateways.sh.

Setup: kvrouterd (Qwen3 tokenizer: the gateways send prompt TEXT), a second kvrouterd that
tokenizes for the engines, N engine_sim engines (tests/integration/engine_sim.py). Three
routings per gateway: kvrouterd fed by the engines' KV events ("kvrouterd"), kvrouterd in
approximate mode ("approximate": a third kvrouterd with [model] approximate = on that gets no
events at all, the engines publish to the tokenizing one instead; it assumes each routed
request's blocks on the chosen engine, [route] assumed_ttl 120 s, assumed_max_blocks =
the engines' cache size), and round-robin. The
Mooncake trace (/work/shared/traces or $KVR_TRACE) gives each request's hash_ids (one per
512-token block); each id becomes a deterministic text chunk of ~`CHUNK_WORDS` words, so
equal ids at the same place are an equal text prefix (scaled down: the Python engines
tokenize every prompt). Latency is measured with one connection (each request waits for
the previous), requests/s with `CONNS` connections, on the first 50 prompts, which every
engine holds beforehand (so the engine work is the same whichever engine is chosen).
"""

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import gwload  # noqa: E402
from engine_sim import EngineSim  # noqa: E402
from kvrharness import REPO, Daemon  # noqa: E402

MODEL = "test/qwen3"


def chunk(h, words):
    rng = random.Random(h)
    return " ".join("%s%d" % (rng.choice(gwload.WORDS), rng.randrange(100))
                    for _ in range(words)) + "\n"


def trace_prompts(path, n, words):
    """(prompts, ideal): ideal = the share of 512-token trace blocks found by a single
    unbounded prefix cache that saw every earlier request (an upper bound for any routing)."""
    out, seen, hit, tot = [], set(), 0, 0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            ids = rec["hash_ids"]
            k = 0
            while k < len(ids) and tuple(ids[:k + 1]) in seen:
                k += 1
            hit, tot = hit + k, tot + len(ids)
            seen.update(tuple(ids[:i + 1]) for i in range(len(ids)))
            out.append("".join(chunk(h, words) for h in ids))
            if len(out) >= n:
                break
    return out, (hit / tot if tot else 0.0)


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")


def replay(gw, prompts):
    """Sequential replay; returns (hit rate over all requests, records)."""
    hit = query = 0
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    routes = {}
    for p in prompts:
        status, hdr, _ = gw.post("/v1/completions", {"model": MODEL, "prompt": p}, conn=conn)
        if status != 200:
            raise RuntimeError("HTTP %d through %s" % (status, gw.kind))
        hit += int(hdr.get("x-engine-cached-blocks", 0))
        query += int(hdr.get("x-engine-query-blocks", 0))
        r = hdr.get("x-kvr-route")
        routes[r] = routes.get(r, 0) + 1
    conn.close()
    return (hit / query if query else 0.0), routes


def latency(gw, prompts, seconds):
    lat = []
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        status, _, _ = gw.post("/v1/completions", {"model": MODEL, "prompt": prompts[i % len(prompts)]},
                               conn=conn)
        lat.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError("HTTP %d" % status)
        i += 1
    conn.close()
    return lat


def throughput(gw, prompts, seconds, conns):
    counts = [0] * conns
    errors = [0] * conns
    end = time.monotonic() + seconds

    def worker(k):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        i = k
        while time.monotonic() < end:
            status, _, _ = gw.post("/v1/completions",
                                   {"model": MODEL, "prompt": prompts[i % len(prompts)]},
                                   conn=conn)
            counts[k] += 1
            errors[k] += status != 200
            i += conns
        conn.close()

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if sum(errors):
        raise RuntimeError("%d of %d requests failed through %s" % (sum(errors), sum(counts),
                                                                    gw.kind))
    return sum(counts) / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4000, help="trace requests replayed")
    ap.add_argument("--chunk-words", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=16384, help="prefix cache per engine")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--timeout-ms", type=int, default=20, help="the gateways' routing budget")
    ap.add_argument("--assumed-max-blocks", type=int, default=0,
                    help="approximate mode's [route] assumed_max_blocks (0: --num-blocks)")
    ap.add_argument("--gateways", default="nginx,haproxy")
    ap.add_argument("--modes", default="kvr,approx,rr",
                    help="kvr (events), approx (approximate mode, no events), rr (round-robin)")
    ap.add_argument("--trace", default=os.environ.get(
        "KVR_TRACE", "/work/shared/traces/synthetic_trace.jsonl"))
    args = ap.parse_args()
    tok_dir = os.path.join(REPO, "build", "tokref", "qwen3")
    cfg = {'model "%s"' % MODEL: {"tokenizer": tok_dir}, "log": {"level": "info"}}
    acfg = {'model "%s"' % MODEL: {"tokenizer": tok_dir, "approximate": "on"},
            "route": {"assumed_max_blocks": str(args.assumed_max_blocks or args.num_blocks)},
            "log": {"level": "info"}}
    tok = Daemon(config=cfg, ready_timeout=60)
    router = Daemon(config=cfg, ready_timeout=60)
    approx = Daemon(config=acfg, ready_timeout=60) if "approx" in args.modes else None
    names = {"kvr": "kvrouterd", "approx": "approximate", "rr": "round-robin"}
    engines = []
    try:
        prompts, ideal = trace_prompts(args.trace, args.requests, args.chunk_words)
        rows = []
        for kind in args.gateways.split(","):
            for mode in args.modes.split(","):
                for e in engines:
                    e.close()
                # fresh engines (empty caches) for each replay; the router forgets nothing
                # about the old pods' blocks, but they are no candidates any more
                rt = approx if mode == "approx" else router
                url = "http://127.0.0.1:%d/v1/route" % rt.http_port
                events = tok.events if mode == "approx" else router.events
                engines = [EngineSim(MODEL, events, tok.http_port,
                                     num_blocks=args.num_blocks) for _ in range(args.engines)]
                for e in engines:
                    e.wait_subscriber()
                gw = gwload.Gateway(kind, [e.pod for e in engines], url,
                                    mode="rr" if mode == "rr" else "kvr",
                                    fetch_timeout_ms=args.timeout_ms)
                try:
                    hr, routes = replay(gw, prompts)
                    short = prompts[: min(50, len(prompts))]
                    # every engine holds every short prompt: the engines do the same work
                    # whichever gets a request, so the difference is the gateway's routing
                    for e in engines:
                        for p in short:
                            e.compute(p)
                    lat = latency(gw, short, args.seconds)
                    rps = throughput(gw, short, args.seconds, args.conns)
                finally:
                    gw.close()
                rows.append((kind, names[mode], hr, rps,
                             percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3, routes))
                print("done %s %s" % (kind, mode), file=sys.stderr, flush=True)
        print("\n%d engines (engine_sim, %d-block prefix cache each), %d Mooncake trace "
              "requests (%d words per 512-token block), routing budget %d ms"
              % (args.engines, args.num_blocks, len(prompts), args.chunk_words, args.timeout_ms))
        print("upper bound (one unbounded cache, trace blocks): hit rate %.3f" % ideal)
        if approx is not None:
            print("approximate mode: assumed_max_blocks %d per engine"
                  % (args.assumed_max_blocks or args.num_blocks))
        print("%-8s %-12s %9s %9s %9s %9s  %s" % ("gateway", "routing", "hit rate", "req/s",
                                                 "p50 ms", "p99 ms", "replay routes"))
        base = {}
        for kind, mode, hr, rps, p50, p99, routes in rows:
            print("%-8s %-12s %9.3f %9.1f %9.2f %9.2f  %s" % (kind, mode, hr, rps, p50, p99,
                                                             routes))
            base.setdefault(kind, {})[mode] = (p50, p99)
        for kind, m in base.items():
            if "kvrouterd" in m and "round-robin" in m:
                print("%s: added latency of the routing call p50 %+.2f ms, p99 %+.2f ms"
                      % (kind, m["kvrouterd"][0] - m["round-robin"][0],
                         m["kvrouterd"][1] - m["round-robin"][1]))
        if approx is not None:
            st, _, body = approx.request("GET", "/metrics", admin=True)
            for line in body.decode().splitlines():
                if line.startswith("kvrouter_route_assum"):
                    print("approximate router: %s" % line)
    finally:
        for e in engines:
            e.close()
        router.stop()
        if approx is not None:
            approx.stop()
        tok.stop()


if __name__ == "__main__":
    main()
