"""Scaling on this machine: what a second writer thread and a second HTTP loop thread buy
(run by bench/scaling.sh). Issue #18 asks for block-ops/s and req/s per added thread.

1. Writers 1 -> 2: ingest_bench's throughput run (a fresh daemon, bench_publisher replaying
   the Mooncake trace through simulated vLLM engines over ZeroMQ as fast as it can, every
   batch applied, zero gaps and the index equal to the engines' caches checked) with
   [events] writer_threads = 1 and 2, interleaved for ROUNDS rounds (the order alternated);
   medians of blocks stored/s and block ops/s (stores + removals).
2. HTTP loops 1 -> 2: two daemons, [http] threads = 1 and 2, loaded with the same 64
   engines' blocks through the real event path (http_load.py, as bench/http.sh), then
   POST /v1/score with 8K-token JSON bodies by wrk, interleaved for ROUNDS rounds: 1 loop
   with wrk -t1, 2 loops with wrk -t1, 2 loops with wrk -t2 (wrk needs CPU too: the 2 cores
   are shared by the daemon, the load generator and, on the development VM, other
   sessions); medians of req/s, with the daemon's CPU use over each run (cores, from
   /proc/PID/stat) and the load average.
The machine is shared: figures are indicative, reported not asserted; a failed correctness
check (ingest) or a non-2xx answer fails the run.

Environment: BUILD, SCALING_ROUNDS (3), SCALING_HTTP_SECONDS (5), SCALING_HTTP_CONNS (32),
KVR_BENCH_* as ingest_bench.py (engines, epochs, trace...).
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ingest_bench as ib  # noqa: E402

ROUNDS = int(os.environ.get("SCALING_ROUNDS", "3"))
HTTP_SECONDS = int(os.environ.get("SCALING_HTTP_SECONDS", "5"))
HTTP_CONNS = int(os.environ.get("SCALING_HTTP_CONNS", "32"))
HERE = os.path.dirname(os.path.abspath(__file__))
CLK = os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def shard(pod, n):
    """The daemon's writer for a pod (kvr_queue_shard: FNV-1a-32 of the name modulo n)."""
    h = 2166136261
    for b in pod.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h % n


def writers():
    split = [0, 0]
    for i in range(ib.ENGINES):  # bench_publisher's topics are kv@bench-<i>@<model>
        split[shard("bench-%d" % i, 2)] += 1
    print("-- writers 1 -> 2: %s, %d engines (pods per writer with 2 writers: %d / %d), %d "
          "rounds (load average %s)" % (os.path.basename(ib.TRACE), ib.ENGINES, split[0],
                                        split[1], ROUNDS, loadavg()))
    runs = {1: [], 2: []}
    for r in range(ROUNDS):
        for w in ((1, 2) if r % 2 == 0 else (2, 1)):
            ib.WRITERS = w
            res, m, dt, problems = ib.run_throughput()
            if problems:
                ib.fail("writers=%d: %s" % (w, "; ".join(problems)))
            stored = res["blocks_stored"] / dt
            ops = (res["blocks_stored"] + res["blocks_removed"]) / dt
            runs[w].append((stored, ops))
            print("  round %d, %d writer(s): %.2f M blocks stored/s, %.2f M block ops/s "
                  "(%.2f s, load average %s)" % (r + 1, w, stored / 1e6, ops / 1e6, dt, loadavg()))
    med = {w: (statistics.median(s for s, _ in v), statistics.median(o for _, o in v))
           for w, v in runs.items()}
    print("writers: 1 -> %.2f M block ops/s (%.2f M stored/s), 2 -> %.2f M (%.2f M); the "
          "second writer adds %.2f M block ops/s (x%.2f)"
          % (med[1][1] / 1e6, med[1][0] / 1e6, med[2][1] / 1e6, med[2][0] / 1e6,
             (med[2][1] - med[1][1]) / 1e6, med[2][1] / med[1][1]))


class HttpDaemon:
    def __init__(self, threads):
        self.tmp = tempfile.mkdtemp(prefix="kvr-bench-scaling-")
        conf = os.path.join(self.tmp, "kvr.conf")
        with open(conf, "w") as f:
            f.write("[log]\nlevel = info\n[events]\nbind = tcp://127.0.0.1:*\n"
                    "writer_threads = 1\n[http]\nlisten = 127.0.0.1:0\nthreads = %d\n"
                    "max_connections = 4096\n[index]\nmax_workers = 1024\n" % threads)
        self.err = open(os.path.join(self.tmp, "stderr.log"), "w+")
        self.proc = subprocess.Popen([ib.BIN, "-c", conf], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 15
        ready = None
        while time.monotonic() < deadline and ready is None and self.proc.poll() is None:
            time.sleep(0.05)
            with open(self.err.name) as f:
                m = ib.READY_RE.search(f.read())
            if m:
                ready = dict(t.partition("=")[::2] for t in m.group(1).split())
        if not ready or "http" not in ready or "events" not in ready:
            self.stop()
            ib.fail("daemon with %d http threads not ready" % threads)
        self.http = ready["http"]
        self.port = int(self.http.rpartition(":")[2])
        self.events = ready["events"].split(",")[0]
        self.out = os.path.join(self.tmp, "q")

    def load(self):
        subprocess.run([sys.executable, os.path.join(HERE, "http_load.py"), "--trace", ib.TRACE,
                        "--events", self.events, "--http", str(self.port), "--out", self.out,
                        "--engines", "64", "--requests", "1024", "--query-tokens", "8192"],
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def wrk(d, wthreads):
    c0, t0 = cpu_s(d.proc.pid), time.monotonic()
    p = subprocess.run(["wrk", "-t%d" % wthreads, "-c%d" % HTTP_CONNS, "-d%ds" % HTTP_SECONDS,
                        "--timeout", "5s", "-s", os.path.join(HERE, "wrk_score.lua"),
                        "http://%s" % d.http, "--", os.path.join(d.out, "queries.json"), "json"],
                       capture_output=True, text=True)
    cores = (cpu_s(d.proc.pid) - c0) / (time.monotonic() - t0)
    m = re.search(r"^Requests/sec:\s*([0-9.]+)", p.stdout, re.M)
    bad = re.search(r"non-2xx (\d+)", p.stdout)
    if p.returncode != 0 or not m or (bad and int(bad.group(1)) != 0):
        ib.fail("wrk: %s %s" % (p.stdout[-800:], p.stderr[-400:]))
    p99 = re.search(r"^LAT .*p99_us=(\d+)", p.stdout, re.M)
    return float(m.group(1)), cores, int(p99.group(1)) if p99 else -1


def http():
    for tool in ("wrk",):
        if not shutil.which(tool):
            print("-- http loops: skipped (%s not installed: make deps DEPS='wrk')" % tool)
            return
    print("-- http loops 1 -> 2: POST /v1/score, 8,192-token JSON, 64 engines' blocks, "
          "%d connections, %d s a run, %d rounds (load average %s)"
          % (HTTP_CONNS, HTTP_SECONDS, ROUNDS, loadavg()))
    ds = {1: HttpDaemon(1), 2: HttpDaemon(2)}
    try:
        for d in ds.values():
            d.load()
        cases = [(1, 1), (2, 1), (2, 2)]  # (loop threads, wrk threads)
        res = {c: [] for c in cases}
        for c in cases:  # warm-up
            wrk(ds[c[0]], c[1])
        for r in range(ROUNDS):
            for c in (cases if r % 2 == 0 else cases[::-1]):
                rps, cores, p99 = wrk(ds[c[0]], c[1])
                res[c].append((rps, cores))
                print("  round %d, %d loop(s), wrk -t%d: %.0f req/s, p99 %d us, daemon %.2f "
                      "cores (load average %s)" % (r + 1, c[0], c[1], rps, p99, cores, loadavg()))
        med = {c: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v))
               for c, v in res.items()}
        base = med[(1, 1)][0]
        print("http: 1 loop %.0f req/s (daemon %.2f cores); 2 loops %.0f req/s with wrk -t1 "
              "(%.2f cores, %+.0f req/s for the added loop), %.0f req/s with wrk -t2 (%.2f "
              "cores, %+.0f req/s)"
              % (base, med[(1, 1)][1], med[(2, 1)][0], med[(2, 1)][1], med[(2, 1)][0] - base,
                 med[(2, 2)][0], med[(2, 2)][1], med[(2, 2)][0] - base))
    finally:
        for d in ds.values():
            d.stop()


def main():
    for f in (ib.BIN, ib.PUB, ib.TRACE):
        if not os.path.exists(f):
            ib.fail("missing %s" % f)
    print("scaling: %d cpu(s) shared by the daemon, the load generators and, on the "
          "development VM, other sessions" % os.cpu_count())
    writers()
    http()
    print("scaling: ok")


if __name__ == "__main__":
    main()
