"""fleet_sim — routing quality with kvrouterd in the loop: a simulated vLLM fleet.

Why: whether a routing policy wins is decided by time to first token under load, which
no unit test shows. This runs N simulated vLLM engines (bench/fleet_engine.py: continuous
batching, chunked prefill, a token budget per step, prefix cache with LRU and KV capacity)
that publish vLLM's real KV events over ZeroMQ to a real kvrouterd and serve a real
Prometheus /metrics, drives them with a workload (bench/fleet_work.py: the Mooncake trace,
a hot system prompt, bursts of siblings) through a router (bench/fleet_routers.py), and
reports TTFT, end-to-end latency, throughput, hit rate and balance per router x workload
x load level (docs/routing.md has the method and the results).

Time. One thread drives every engine by a virtual clock: a heap of step ends plus the
sorted arrivals. In real-time mode (the default) the event at simulated time t is
processed at wall time t0 + t / speed, so kvrouterd's real HTTP and ZeroMQ latencies count
(x speed) in simulated time: a request reaches its engine at arrival + routing wall time x
speed. Routing calls run on a small pool of threads (a gateway's concurrency) and hand
their decisions back to the loop. Every event's lateness (wall time past its due time)
is measured; a cell whose p99 lateness exceeds --max-lag-ms is flagged (and the run exits
non-zero with --strict-lag), one past --abort-lag-s is stopped. Calibration runs
round-robin without kvrouterd in virtual time (as fast as the CPU goes).

Load levels. Utilization of an engine = its budget-weighted busy time / elapsed time (a
step's fixed cost is charged in proportion to the share of the token budget it used, so
an engine decoding one sequence is nearly idle and one filling every step's budget is at
1.0). For each workload the calibration finds r80, the rate at which round-robin runs the
fleet at 0.80 utilization over the measured window; load L means the rate L x r80 / 0.8
(capacity = r80 / 0.8). The rate is the trace's speed-up for mooncake, requests/s for hot,
bursts per 0.3 s for burst.

Validation (after each real-time cell): arrivals stop, every engine's last batch is seen
applied in kvrouterd's /v1/pods, then for a sample of the cell's prompts every engine's
cached prefix (its own block pool) must equal /v1/score's matched_blocks for it; a
mismatch fails the run.

Usage: /usr/bin/python3 bench/fleet_sim.py --help; bench/fleet.sh runs a short version.
"""

import argparse
import datetime
import gc
import heapq
import http.client
import itertools
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import fleet_routers  # noqa: E402
import fleet_work  # noqa: E402
from fleet_engine import EngineConfig, MetricsServer, Req, SimEngine  # noqa: E402

MODEL = "fleet/model"
INF = float("inf")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def pct(xs, p):
    """Nearest-rank percentile of a sorted list."""
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


class KvrClient:
    """A kept-alive HTTP connection to kvrouterd (one per routing thread)."""

    def __init__(self, port, timeout=10):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def post(self, path, body, method="POST"):
        data = body.encode() if isinstance(body, str) else body
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                hdrs = {"Content-Type": "application/json"} if data is not None else {}
                self.conn.request(method, path, body=data, headers=hdrs)
                resp = self.conn.getresponse()
                raw = resp.read()
                try:
                    ans = json.loads(raw) if raw else None
                except ValueError:
                    ans = raw[:200]
                return resp.status, ans
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        return None, None

    def get(self, path):
        return self.post(path, None, method="GET")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ---- the fleet ----------------------------------------------------------------------------------

class KvrReplicas:
    """KvrClient's interface over several kvrouterd replicas: each call goes to the next one
    (a round-robin of callers in front of the replicas), one kept-alive connection each."""

    _turn = itertools.count()

    def __init__(self, ports, timeout=10):
        self.clients = [KvrClient(p, timeout) for p in ports]

    def post(self, path, body, method="POST"):
        c = self.clients[next(KvrReplicas._turn) % len(self.clients)]
        return c.post(path, body, method)

    def get(self, path):
        return self.post(path, None, method="GET")

    def close(self):
        for c in self.clients:
            c.close()


def kvr_client(ports):
    return KvrClient(ports[0]) if len(ports) == 1 else KvrReplicas(ports)


class Fleet:
    """N engines; with a daemon, each one with its /metrics server and KV-event publisher
    (connected to every daemon of `others` too: replicas each read every engine)."""

    def __init__(self, n, cfg, daemon=None, others=()):
        self.cfg = cfg
        self.daemon = daemon
        self.engines = []
        self.servers = []
        self.pubs = []
        for i in range(n):
            if daemon is None:
                self.engines.append(SimEngine(i, cfg, None, "engine-%d" % i, MODEL))
                continue
            from vllm_pub import Engine as PubEngine
            srv = MetricsServer()
            pod = "127.0.0.1:%d" % srv.port
            pub = PubEngine(pod=pod, model=MODEL, mode="connect", endpoints=[daemon.events[0]],
                            block_size=cfg.block_size, num_blocks=1, buffer_steps=4,
                            hwm=1000000)
            eng = SimEngine(i, cfg, pub.rank(0), pod, MODEL)
            srv.start(eng)
            self.servers.append(srv)
            self.pubs.append(pub)
            self.engines.append(eng)
        for pub in self.pubs:
            pub.wait_subscriber(10)
            for d in others:
                pub.rank(0).pub.connect(d.events[0])
        for e in self.engines:  # an empty batch: the stream is known from the start
            if e.pub is not None:
                e.pub.publish()
        deadline = time.monotonic() + 10
        for d in others:  # slow joiners: empty batches until every replica knows every pod
            while True:
                st, ans = d.json("GET", "/v1/pods", admin=True)
                known = {p.get("pod") for p in (ans or {}).get("pods", [])}
                if all(e.pod in known for e in self.engines):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("a replica never saw every engine: %r" % sorted(known))
                for e in self.engines:
                    e.pub.publish()
                time.sleep(0.05)

    @property
    def pods(self):
        return [e.pod for e in self.engines]

    def close(self):
        for s in self.servers:
            s.stop()
        for p in self.pubs:
            p.close()


# ---- the loop -----------------------------------------------------------------------------------

class Loop:
    """Drives the fleet through one workload with one router."""

    def __init__(self, fleet, router, reqs, args, realtime, kvr_ports=None):
        self.fleet = fleet
        self.engines = fleet.engines
        self.router = router
        self.reqs = reqs
        self.args = args
        self.realtime = realtime
        self.kvr_ports = kvr_ports
        self.speed = args.speed
        self.heap = []
        self.seq = 0
        self.last_t = 0.0
        self.done = 0
        self.lags = []
        self.route_errors = 0
        self.pd_split = 0
        self.inbox = queue.SimpleQueue()
        self.outbox = queue.SimpleQueue()
        self.threads = []
        self.t0 = None
        self.aborted = None

    # engine events
    def _start(self, e, t):
        d = e.start_step(t)
        if d is not None:
            self.seq += 1
            heapq.heappush(self.heap, (t + d, self.seq, e.idx))

    def _enqueue(self, req, i, t):
        if isinstance(i, tuple):  # (prefill engine, decode engine): disaggregated
            p, dec = i
            sh = Req(-1, req.arrival, req.prompt, 1, "pd-prefill")
            sh.chain = list(req.chain)
            sh.pd = (req, dec)
            req.routed_t = t
            self.pd_split += 1
            e = self.engines[p]
            e.add(sh)
            if e.idle():
                self._start(e, t)
            return
        req.routed_t = t
        e = self.engines[i]
        e.add(req)
        if e.idle():
            self._start(e, t)

    def _step_end(self, i, t):
        e = self.engines[i]
        firsts, done = e.end_step(t)
        r = self.router
        for q in firsts:
            if q.pd is None:
                r.on_first_token(q)
        for q in done:
            if q.pd is not None:  # a prefill copy: its KV goes to the decode engine
                self.seq += 1
                blocks = (q.plen + self.args.block_size - 1) // self.args.block_size
                heapq.heappush(self.heap, (t + blocks * self.args.pd_xfer_ms * 1e-3, self.seq,
                                           ("xfer", q)))
                continue
            r.on_done(q)
            self.done += 1
        self._start(e, t)

    # routing threads (real time)
    def _route_worker(self):
        kvr = kvr_client(self.kvr_ports) if self.router.needs_kvr else None
        router = self.router
        inbox = self.inbox
        n = len(self.engines)
        try:
            while True:
                item = self.outbox.get()
                if item is None:
                    return
                req, w_sub = item
                w0 = time.perf_counter()
                try:
                    i = router.route(req, kvr)
                except Exception as ex:  # a failed call: the gateway's own round-robin
                    self.route_errors += 1
                    if self.route_errors <= 3:
                        log("routing error (%s): %s" % (router.name, ex))
                    i = req.rid % n
                    kvr = kvr_client(self.kvr_ports) if router.needs_kvr else None
                w1 = time.perf_counter()
                req.route_ms = (w1 - w0) * 1000.0
                inbox.put((req, i, w1 - w_sub))
        finally:
            if kvr is not None:
                kvr.close()

    def run(self):
        args = self.args
        reqs = self.reqs
        nreq = len(reqs)
        end_t = args.duration + args.drain
        if self.realtime:
            for _ in range(args.route_threads):
                th = threading.Thread(target=self._route_worker, daemon=True)
                th.start()
                self.threads.append(th)
        ai = 0
        heap = self.heap
        speed = self.speed
        pending = 0
        clock = time.perf_counter
        self.t0 = t0 = clock() + 0.05
        abort_lag = args.abort_lag_s
        lags = self.lags
        inbox = self.inbox
        try:
            while True:
                if self.realtime:
                    while True:
                        try:
                            req, i, wdt = inbox.get_nowait()
                        except queue.Empty:
                            break
                        pending -= 1
                        t = req.arrival + wdt * speed
                        if t < self.last_t:
                            t = self.last_t
                        self._enqueue(req, i, t)
                na = reqs[ai].arrival if ai < nreq else INF
                nh = heap[0][0] if heap else INF
                nt = na if na < nh else nh
                if nt == INF:
                    if pending == 0:
                        break
                    try:
                        req, i, wdt = inbox.get(timeout=1.0)
                    except queue.Empty:
                        continue
                    pending -= 1
                    self._enqueue(req, i, max(self.last_t, req.arrival + wdt * speed))
                    continue
                if nt > end_t:
                    break
                if self.realtime:
                    target = t0 + nt / speed
                    now = clock()
                    if now < target:
                        try:
                            req, i, wdt = inbox.get(timeout=min(target - now, 0.05))
                        except queue.Empty:
                            continue
                        pending -= 1
                        self._enqueue(req, i, max(self.last_t, req.arrival + wdt * speed))
                        continue
                    lag = now - target
                    lags.append(lag)
                    if lag > abort_lag:
                        self.aborted = "simulation %.1f s behind real time at t=%.1f" % (lag, nt)
                        break
                self.last_t = nt
                if nh <= na:
                    _, _, i = heapq.heappop(heap)
                    if isinstance(i, tuple):  # a KV transfer ends: the decode engine takes it
                        req, dec = i[1].pd
                        req.kv_in = True
                        e = self.engines[dec]
                        e.add(req)
                        if e.idle():
                            self._start(e, nt)
                    else:
                        self._step_end(i, nt)
                else:
                    req = reqs[ai]
                    ai += 1
                    if self.realtime:
                        pending += 1
                        self.outbox.put((req, clock()))
                    else:
                        self._enqueue(req, self.router.route(req, None), nt)
                if self.done == nreq and ai == nreq:
                    break
        finally:
            for _ in self.threads:
                self.outbox.put(None)
            for th in self.threads:
                th.join(5)
        self.wall = clock() - t0
        return self


# ---- one cell -----------------------------------------------------------------------------------

def split_router(name):
    """"kvrouterd-gw+route.predicted_ttl=0": the router and kvrouterd settings of its own
    (on top of --kvr-set), so that one run can hold a setting's with and without."""
    base, *sets = name.split("+")
    return base, sets


def daemon_config(args, extra=()):
    cfg = {"log": {"level": "info"},
           'model "%s"' % MODEL: {"block_size": str(args.block_size)},
           "route": {"seed": str(args.seed)}}
    for kv in list(args.kvr_set) + list(extra):
        key, _, val = kv.partition("=")
        sect, _, k = key.rpartition(".")
        cfg.setdefault(sect, {})[k] = val
    return cfg


def engine_config(args):
    return EngineConfig(budget=args.budget, step_fixed=args.step_fixed,
                        per_prefill_token=args.per_prefill_token,
                        per_decode_seq=args.per_decode_seq, num_blocks=args.num_blocks,
                        block_size=args.block_size, max_num_seqs=args.max_num_seqs)


def settle(fleet, daemon, timeout=20.0):
    """Waits until kvrouterd applied every engine's last batch. Returns the /v1/pods rows."""
    for e in fleet.engines:
        e.flush_events()
    want = {e.pod: e.pub.seq - 1 for e in fleet.engines}
    deadline = time.monotonic() + timeout
    rows = []
    while time.monotonic() < deadline:
        st, ans = daemon.json("GET", "/v1/pods", admin=True)
        rows = [p for p in (ans or {}).get("pods", []) if p.get("pod") in want]
        seen = {p["pod"]: p.get("last_seq") for p in rows}
        if all(seen.get(p) == s for p, s in want.items()):
            return rows
        time.sleep(0.05)
    raise RuntimeError("events did not settle in %.0f s: want %r, /v1/pods %r"
                       % (timeout, want, rows))


def route_counters(daemon):
    """kvrouterd's unlabelled kvrouter_route_* series at the end of a cell (confirmed,
    expired, estimated prefills...): what its in-flight accounting saw; and the predicted
    entries' labelled ones (made, confirmed, contradicted, expired)."""
    try:
        st, _, body = daemon.request("GET", "/metrics", admin=True)
    except OSError:
        return {}
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if (line.startswith("kvrouter_share_") or (
                line.startswith("kvrouter_route_") and ("{" not in line or
                                                        line.startswith("kvrouter_route_predict")))):
            name, _, val = line.partition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def validate(fleet, daemon, reqs, sample, seed):
    """Every engine's cached prefix of sampled prompts == kvrouterd's matched_blocks."""
    rows = settle(fleet, daemon)
    bad_streams = [p for p in rows if p.get("state") != "synced" or p.get("orphans")]
    rng = random.Random(seed)
    pick = reqs if len(reqs) <= sample else rng.sample(reqs, sample)
    kvr = KvrClient(daemon.http_port)
    pods = fleet.pods
    mism = []
    nonzero = 0
    try:
        for r in pick:
            body = '{"model":%s,"token_ids":[%s],"pods":%s}' % (
                json.dumps(MODEL), r.prompt.json_ids(), json.dumps(pods))
            st, ans = kvr.post("/v1/score", body)
            if st != 200:
                raise RuntimeError("/v1/score HTTP %s %r" % (st, ans))
            got = {s["pod"]: s["matched_blocks"] for s in ans["scores"]}
            for e in fleet.engines:
                want = e.cached_prefix_blocks(r.prompt.hashes)
                nonzero += want > 0
                if got.get(e.pod, 0) != want:
                    mism.append((r.rid, e.pod, want, got.get(e.pod, 0)))
    finally:
        kvr.close()
    held = sum(len(e.pool.cached) for e in fleet.engines)
    indexed = sum(p.get("blocks", 0) for p in rows)
    return {"prompts": len(pick), "pairs": len(pick) * len(pods), "nonzero_pairs": nonzero,
            "mismatches": len(mism), "examples": mism[:5], "engine_blocks": held,
            "indexed_blocks": indexed, "streams_not_synced": len(bad_streams),
            "ok": not mism and not bad_streams and held == indexed}


def summarize(loop, reqs, args, fleet):
    w0, w1 = args.warmup, args.duration
    meas = [r for r in reqs if w0 <= r.arrival < w1]
    fin = [r for r in meas if r.done_t is not None]
    ttft = sorted(r.first_t - r.arrival for r in fin)
    e2e = sorted(r.done_t - r.arrival for r in fin)
    itl = sorted((r.done_t - r.first_t) / (r.olen - 1) for r in fin if r.olen > 1)
    unfinished = len(meas) - len(fin)
    started = [r for r in meas if r.first_t is not None and r.done_t is None]
    engines = fleet.engines
    n = len(engines)
    counts = [0] * n
    for r in meas:
        if r.engine is not None:
            counts[r.engine] += 1
    tot = max(1, sum(counts))
    q = sum(e.prefix_queries for e in engines)
    h = sum(e.prefix_hits for e in engines)
    lags = sorted(loop.lags)
    rms = sorted(r.route_ms for r in meas)
    win = w1 - w0
    res = {
        "requests": len(meas), "completed": len(fin), "unfinished": unfinished,
        "unfinished_started": len(started),
        "ttft": [pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)],
        "e2e": [pct(e2e, 50), pct(e2e, 90), pct(e2e, 99)],
        "itl": [pct(itl, 50), pct(itl, 90), pct(itl, 99)],
        "pd_split": loop.pd_split,
        "ttft_mean": sum(ttft) / len(ttft) if ttft else None,
        "output_tok_s": sum(e.window_tokens for e in engines) / win,
        "hit_rate": h / q if q else 0.0,
        "share": [c / tot for c in counts],
        "kv_waits": sum(e.kv_waits for e in engines),
        "preemptions": sum(e.preemptions for e in engines),
        "kv_peak": max(e.kv_peak for e in engines),
        "utilization": sum(e.util_win for e in engines) / (n * win),
        "utilization_per_engine": [e.util_win / win for e in engines],
        "route_ms": [pct(rms, 50), pct(rms, 99)],
        "lag_ms": [pct(lags, 50) * 1e3, pct(lags, 99) * 1e3, (lags[-1] if lags else 0) * 1e3],
        "lag_end_ms": (lags[-1] * 1e3) if lags else 0.0,
        "sim_end": loop.last_t,
        "wall_s": loop.wall,
        "route_errors": loop.route_errors,
        "fallbacks": loop.router.fallbacks,
        "reasons": dict(loop.router.reasons),
        "stored_blocks": sum(e.stored_blocks for e in engines),
        "removed_blocks": sum(e.removed_blocks for e in engines),
        "aborted": loop.aborted,
        # conversations (mooncake): follow-up turns, and those that ran on their previous
        # turn's engine
        "followups": sum(1 for r in meas if r.parent is not None),
        "followups_same": sum(1 for r in meas if r.parent is not None
                              and r.engine is not None and r.engine == r.parent.engine),
        # The tail, to tell a router's doing from a prompt's own cost: the 10 slowest
        # first tokens with their prompt, what their engine had cached and the minimum
        # prefill time of the uncached rest at the calibrated rate.
        "slowest": [{"arrival": round(r.arrival, 3), "ttft": round(r.first_t - r.arrival, 3),
                     "prompt": r.plen, "hit": r.hit_tokens, "engine": r.engine,
                     "alone_s": round((r.plen - (r.hit_tokens or 0))
                                      * (args.step_fixed + args.budget * args.per_prefill_token)
                                      / args.budget, 3),
                     "kvr": r.kvr}
                    for r in sorted(fin, key=lambda r: r.first_t - r.arrival)[-10:]],
    }
    together = burst_together(meas)
    if together is not None:
        res["burst_together"] = together
    return res


def burst_together(meas):
    """Workload burst: the share of siblings (all but each burst's first arrival) routed to
    the engine its first sibling went to; None for other workloads. A burst is named by its
    prompt's first segment ("bp<seed>-<burst>", fleet_work.burst)."""
    bursts = {}
    for r in meas:
        key = r.prompt.parts[0][0].key if r.prompt.parts else None
        if not (isinstance(key, str) and key.startswith("bp")) or r.engine is None:
            continue
        bursts.setdefault(key, []).append(r)
    if not bursts:
        return None
    same = total = 0
    for rs in bursts.values():
        rs.sort(key=lambda r: r.arrival)
        same += sum(r.engine == rs[0].engine for r in rs[1:])
        total += len(rs) - 1
    return same / total if total else None


_CORPORA = {}


def build_reqs(args, workload, rate, duration):
    """Fresh requests (they carry their run's state); the token segments and their hashes
    are shared between the builds of one workload."""
    t = time.perf_counter()
    corpus = _CORPORA.setdefault(workload, fleet_work.Corpus(args.block_size))
    reqs, info = fleet_work.build(workload, rate, duration, seed=args.seed, trace=args.trace,
                                  start=args.trace_start, max_tokens=args.max_model_len,
                                  corpus=corpus)
    info["build_s"] = time.perf_counter() - t
    return reqs, info


def run_virtual(args, workload, rate, router_name="round-robin"):
    """Calibration: the fleet without kvrouterd, as fast as the CPU goes."""
    reqs, info = build_reqs(args, workload, rate, args.duration)
    router_name = split_router(router_name)[0]
    fleet = Fleet(args.engines, engine_config(args))
    for e in fleet.engines:
        e.window = (args.warmup, args.duration)
    ctx = fleet_routers.Ctx(fleet.pods, MODEL, args.block_size, fleet.engines, args.seed,
                            args.llmd_ttft_bound)
    router = fleet_routers.make(router_name, ctx)
    if router.needs_kvr:
        raise SystemExit("router %s needs kvrouterd: no virtual-time run" % router_name)
    loop = Loop(fleet, router, reqs, args, realtime=False).run()
    res = summarize(loop, reqs, args, fleet)
    res["workload_info"] = info
    return res


def run_cell(args, workload, rate, router_name, reqs=None):
    from kvrharness import Daemon, free_port
    if reqs is None:
        reqs, info = build_reqs(args, workload, rate, args.duration)
    else:
        info = {}
    router_name, sets = split_router(router_name)
    _, nrep, share = fleet_routers.split_replicas(router_name)
    cfgs = [daemon_config(args, sets) for _ in range(nrep)]
    if nrep > 1 and share:
        ports = [free_port() for _ in range(nrep)]
        for c, p in zip(cfgs, ports):
            c.setdefault("route", {})["peer_bind"] = "tcp://127.0.0.1:%d" % p
            c["route"]["peers"] = " ".join("tcp://127.0.0.1:%d" % q for q in ports)
    daemon = Daemon(config=cfgs[0], ready_timeout=30)
    others = []
    fleet = None
    try:
        for c in cfgs[1:]:
            others.append(Daemon(config=c, ready_timeout=30))
        fleet = Fleet(args.engines, engine_config(args), daemon, others)
        for e in fleet.engines:
            e.window = (args.warmup, args.duration)
        ctx = fleet_routers.Ctx(fleet.pods, MODEL, args.block_size, fleet.engines, args.seed,
                                args.llmd_ttft_bound)
        ctx.pd_prefill = args.pd_prefill
        router = fleet_routers.make(router_name, ctx)
        load0 = os.getloadavg()[0]
        # the corpus, the requests and the block pools are millions of long-lived objects:
        # keep the cyclic GC's full collections (stalls of a second) off them
        gc.collect()
        gc.freeze()
        cpu0 = os.times()
        try:
            loop = Loop(fleet, router, reqs, args, realtime=True,
                        kvr_ports=[daemon.http_port] + [d.http_port for d in others]).run()
        finally:
            gc.unfreeze()
        cpu1 = os.times()
        res = summarize(loop, reqs, args, fleet)
        res["cpu_s"] = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        res["loadavg"] = [load0, os.getloadavg()[0]]
        res["workload_info"] = info
        res["kvr_route"] = route_counters(daemon)
        res["replicas"] = nrep
        res["shared"] = share
        if args.validate_sample > 0:
            res["validation"] = validate(fleet, daemon, reqs, args.validate_sample, args.seed)
        return res
    finally:
        if fleet is not None:
            fleet.close()
        for d in others:
            d.stop()
        daemon.stop()


# ---- calibration ----------------------------------------------------------------------------------

GUESS = {"mooncake": 2.0, "hot": 40.0, "burst": 1.0}


def calibrate(args, workload, target=0.80):
    """r80: the rate at which round-robin runs the fleet at `target` utilization."""
    rate = GUESS.get(workload, 1.0)
    hist = []
    for _ in range(6):
        t = time.perf_counter()
        res = run_virtual(args, workload, rate)
        u = res["utilization"]
        hist.append((rate, u, time.perf_counter() - t))
        log("calibrate %s: rate %.4g -> round-robin utilization %.3f (%.1f s)"
            % (workload, rate, u, hist[-1][2]))
        if abs(u - target) <= 0.015:
            break
        if u <= 0:
            rate *= 4
            continue
        # secant on the last two points when they bracket sensibly, else proportional
        if len(hist) >= 2 and hist[-1][1] != hist[-2][1] and hist[-1][1] < 0.97 and hist[-2][1] < 0.97:
            (r1, u1, _), (r2, u2, _) = hist[-2], hist[-1]
            nr = r2 + (target - u2) * (r2 - r1) / (u2 - u1)
            rate = nr if nr > 0 else rate * target / u
        else:
            rate = rate * target / min(u, 1.0)
    best = min(hist, key=lambda h: abs(h[1] - target))
    return {"r80": best[0], "utilization": best[1], "iterations": [list(h) for h in hist]}


# ---- report ----------------------------------------------------------------------------------------

def fmt3(v):
    return "%.2f / %.2f / %.2f" % tuple(v)


def load_label(load):
    return "~%d%%" % round(load * 100)


def report(results, routers, workloads, loads):
    out = []
    cols = [(w, l) for w in workloads for l in loads]
    out.append("TTFT p50 / p90 / p99 (simulated s)\n")
    out.append("| router | " + " | ".join("%s %s" % (w, load_label(l)) for w, l in cols) + " |")
    out.append("|---|" + "---|" * len(cols))
    for r in routers:
        cells = []
        for w, l in cols:
            res = results.get((r, w, l))
            if res is None:
                cells.append("-")
            else:
                flag = "" if res.get("ok", True) else " ⚠"
                cells.append(fmt3(res["ttft"]) + flag)
        base, sets = split_router(r)
        out.append("| %s | %s |" % (fleet_routers.describe(base)
                                    + ("".join(" `%s`" % s for s in sets)), " | ".join(cells)))
    out.append("")
    out.append("Per cell: end-to-end latency p50 / p90 / p99 (s), output tokens/s, engine-side "
               "prefix hit rate (tokens), requests per engine (min-max %), requests that waited "
               "for KV blocks / preemptions, routing call p50 / p99 (wall ms), round-robin-style "
               "utilization, loop lateness p99 (wall ms)\n")
    out.append("| workload | load | router | E2E p50 / p90 / p99 | out tok/s | hit rate | "
               "share % | waits / preempt | route ms | util | lag p99 ms |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for w, l in cols:
        for r in routers:
            res = results.get((r, w, l))
            if res is None:
                continue
            sh = res["share"]
            out.append("| %s | %s | %s | %s | %.0f | %.3f | %.1f-%.1f | %d / %d | %.2f / %.2f | "
                       "%.2f | %.1f |"
                       % (w, load_label(l), r, fmt3(res["e2e"]), res["output_tok_s"],
                          res["hit_rate"], 100 * min(sh), 100 * max(sh), res["kv_waits"],
                          res["preemptions"], res["route_ms"][0], res["route_ms"][1],
                          res["utilization"], res["lag_ms"][1]))
    return "\n".join(out)


def report_from(args):
    results = {}
    metas = []
    for path in args.report_from.split(","):
        with open(path) as f:
            data = json.load(f)
        metas.append(data["meta"])
        for res in data["results"]:
            res["source"] = os.path.basename(path)
            results[(res["router"], res["workload"], res["load"])] = res
    order = lambda xs: list(dict.fromkeys(xs))  # noqa: E731
    routers = order(k[0] for k in results)
    workloads = order(k[1] for k in results)
    loads = sorted(set(k[2] for k in results))
    table = report(results, routers, workloads, loads)
    flagged = ["%s/%s/%s" % (k[1], load_label(k[2]), k[0]) for k, v in results.items()
               if not v.get("ok", True)]
    print(table)
    if flagged:
        print("\nflagged: " + ", ".join(flagged))
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    return 0


def git_rev():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", default="round-robin,least-loaded,kvrouterd-gw,"
                    "kvrouterd-cost-true,kvrouterd-cache_aware-true,sglang,dynamo,llm-d",
                    help="comma-separated: %s, kvrouterd:<policy>" % ", ".join(fleet_routers.ROUTERS))
    ap.add_argument("--workloads", default="mooncake,hot,burst")
    ap.add_argument("--loads", default="0.8,1.3",
                    help="fractions of the fleet's round-robin capacity (r80 / 0.8)")
    ap.add_argument("--rate", action="append", default=[],
                    help="WORKLOAD=R80 skips that workload's calibration")
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0, help="arrivals window, simulated s")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="requests arriving before this are not measured")
    ap.add_argument("--drain", type=float, default=180.0,
                    help="after the window, at most this long for the last requests")
    ap.add_argument("--speed", type=float, default=1.0,
                    help="simulated seconds per wall second (0.5: half speed)")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--step-fixed", type=float, default=0.007)
    ap.add_argument("--per-prefill-token", type=float, default=42e-6)
    ap.add_argument("--per-decode-seq", type=float, default=60e-6)
    ap.add_argument("--num-blocks", type=int, default=32768, help="KV capacity per engine")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=131072,
                    help="trace requests longer than this (prompt + output) are left out")
    ap.add_argument("--trace", default=os.environ.get(
        "KVR_TRACE", "/work/shared/traces/synthetic_trace.jsonl"))
    ap.add_argument("--trace-start", type=float, default=780.0,
                    help="trace time (s) to start at (the first ~10 minutes are mostly new "
                    "conversations: little prefix reuse)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pd-prefill", type=int, default=0,
                    help="disaggregated fleets: the first N engines prefill, the rest decode "
                    "(for the routers kvrouterd-pd and pd-random; others ignore the roles)")
    ap.add_argument("--pd-xfer-ms", type=float, default=0.08,
                    help="KV transfer from a prefill to a decode engine, ms per block "
                    "(0.08: a 2 MiB block of an 8B model over ~25 GB/s)")
    ap.add_argument("--route-threads", type=int, default=4)
    ap.add_argument("--llmd-ttft-bound", type=float, default=1.0,
                    help="llm-d stickiness break: predicted TTFT difference (s)")
    ap.add_argument("--kvr-set", action="append", default=[],
                    help="SECTION.KEY=VALUE added to kvrouterd's config (repeatable)")
    ap.add_argument("--validate-sample", type=int, default=200)
    ap.add_argument("--max-lag-ms", type=float, default=50.0,
                    help="a cell whose loop lateness p99 exceeds this is flagged")
    ap.add_argument("--strict-lag", action="store_true", help="exit non-zero on a flagged cell")
    ap.add_argument("--abort-lag-s", type=float, default=5.0)
    ap.add_argument("--calibrate-only", action="store_true")
    ap.add_argument("--json", default=os.path.join(ROOT, "build", "fleet", "results.json"))
    ap.add_argument("--md", default=None, help="also write the tables here")
    ap.add_argument("--report-from", default=None,
                    help="FILE[,FILE...]: no run, the tables from earlier --json files (a cell "
                    "found in a later file replaces the earlier one)")
    args = ap.parse_args(argv)
    if args.report_from:
        return report_from(args)
    if not os.environ.get("KVR_BIN"):
        os.environ["KVR_BIN"] = os.path.join(ROOT, "build", "release", "kvrouterd")

    routers = [r for r in args.routers.split(",") if r]
    workloads = [w for w in args.workloads.split(",") if w]
    loads = [float(x) for x in args.loads.split(",") if x]
    if args.pd_prefill <= 0 and any(split_router(r)[0] in ("kvrouterd-pd", "pd-random")
                                    for r in routers):
        raise SystemExit("kvrouterd-pd and pd-random need --pd-prefill N (1 <= N < engines)")
    for r in routers:  # fail early on a bad name
        fleet_routers.make(split_router(r)[0], fleet_routers.Ctx(["a"], MODEL, 16, [], 1))
    fixed = {}
    for kv in args.rate:
        w, _, v = kv.partition("=")
        fixed[w] = float(v)

    started = time.time()
    meta = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_rev(), "argv": sys.argv[1:], "engine": engine_config(args).as_dict(),
            "prefill_tok_s": engine_config(args).prefill_rate(), "args": vars(args)}
    calib = {}
    for w in workloads:
        if w in fixed:
            calib[w] = {"r80": fixed[w], "given": True}
        else:
            calib[w] = calibrate(args, w)
        log("%s: r80 = %.4g (round-robin at 80%% utilization), capacity %.4g"
            % (w, calib[w]["r80"], calib[w]["r80"] / 0.8))
    meta["calibration"] = calib
    if args.calibrate_only:
        print(json.dumps(calib, indent=1))
        return 0

    results = {}
    raw = []
    failed = []
    flagged = []
    for w in workloads:
        for l in loads:
            rate = l * calib[w]["r80"] / 0.8
            for r in routers:
                reqs, info = build_reqs(args, w, rate, args.duration)
                log("== %s load %s (rate %.4g, %d requests) router %s"
                    % (w, load_label(l), rate, len(reqs), r))
                res = run_cell(args, w, rate, r, reqs)
                res["workload_info"] = info
                res.update({"router": r, "workload": w, "load": l, "rate": rate})
                v = res.get("validation")
                lag_ok = res["lag_ms"][1] <= args.max_lag_ms and not res["aborted"]
                res["ok"] = lag_ok and (v is None or v["ok"])
                if not lag_ok:
                    flagged.append("%s/%s/%s" % (w, load_label(l), r))
                if v is not None and not v["ok"]:
                    failed.append("%s/%s/%s: %r" % (w, load_label(l), r, v))
                if "burst_together" in res:
                    log("   siblings on their first sibling's engine: %.3f" % res["burst_together"])
                log("   ITL %s  split %d" % (fmt3([x * 1e3 for x in res["itl"]]), res["pd_split"]))
                log("   TTFT %s  E2E %s  out %.0f tok/s  hit %.3f  waits %d preempt %d  "
                    "route %.2f/%.2f ms  util %.2f  lag p50/p99/max %.1f/%.1f/%.1f ms  wall %.0f s"
                    % (fmt3(res["ttft"]), fmt3(res["e2e"]), res["output_tok_s"], res["hit_rate"],
                       res["kv_waits"], res["preemptions"], res["route_ms"][0], res["route_ms"][1],
                       res["utilization"], res["lag_ms"][0], res["lag_ms"][1], res["lag_ms"][2],
                       res["wall_s"]))
                if v is not None:
                    log("   validate: %d prompts x %d engines (%d pairs with a cached prefix), "
                        "%d mismatches; engines hold %d blocks, kvrouterd %d; %s"
                        % (v["prompts"], args.engines, v["nonzero_pairs"], v["mismatches"],
                           v["engine_blocks"], v["indexed_blocks"], "OK" if v["ok"] else "FAILED"))
                if res["aborted"]:
                    log("   ABORTED: %s" % res["aborted"])
                results[(r, w, l)] = res
                raw.append(res)
                del reqs
    meta["wall_s"] = time.time() - started
    meta["flagged_lag"] = flagged
    meta["validation_failures"] = failed
    table = report(results, routers, workloads, loads)
    head = ("fleet_sim %s, commit %s, %d engines (%.0f prefill tok/s each, budget %d, %d KV "
            "blocks), %g s window (first %g s not measured), speed %g; r80: %s; wall %.0f s"
            % (meta["date"], meta["commit"], args.engines, meta["prefill_tok_s"], args.budget,
               args.num_blocks, args.duration, args.warmup, args.speed,
               ", ".join("%s %.4g" % (w, calib[w]["r80"]) for w in workloads), meta["wall_s"]))
    print(head + "\n")
    print(table)
    if flagged:
        print("\nflagged (loop lateness p99 over %g ms, marked ⚠): %s"
              % (args.max_lag_ms, ", ".join(flagged)))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": raw}, f, indent=1, default=str)
        print("\nraw results: %s" % args.json)
    if args.md:
        with open(args.md, "w") as f:
            f.write(head + "\n\n" + table + "\n")
    if failed:
        print("VALIDATION FAILED:\n  " + "\n  ".join(failed))
        return 1
    if flagged and args.strict_lag:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
