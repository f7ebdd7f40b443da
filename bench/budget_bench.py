"""Memory cap benchmark driver (run by bench/budget.sh): the Mooncake trace replayed by
simulated vLLM engines (bench_publisher) into kvrouterd, first without a cap, then with
[index] max_memory set halfway between the empty index and the uncapped run's peak.

Reported for both runs (the same publishing, as fast as possible): index bytes sampled every
20 ms (peak, and for the capped run the largest excess over the cap), blocks stored and
refused (events_skipped_total{reason="over_budget"}, events_blocks_over_budget_total), the
streams per state at the end, the daemon's RSS at the end and its peak (VmHWM: it includes
the ZeroMQ receive backlog, the publisher running at full speed), and /v1/score answered
throughout by a client thread asking the trace's first prompts (answers, non-200s, p50/p99
latency, best match). Checks (correctness, not speed): every batch applied, no gap, the
capped run refused stores, its index never passed the cap by more than a growth step per
writer (a 2 MiB node chunk, plus 1 MiB for map doublings), every /v1/score answered 200.

Environment: BUILD, KVR_BENCH_TRACE, KVR_BENCH_EPOCHS (2), KVR_BENCH_ENGINES (8),
KVR_BENCH_BLOCK_SIZE (16), KVR_BENCH_CACHE_BLOCKS (16384), KVR_BENCH_WRITERS (2).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build/release")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(REPO, BUILD)
BIN = os.path.join(BUILD, "kvrouterd")
PUB = os.path.join(BUILD, "bench", "bench_publisher")
TRACE = os.environ.get("KVR_BENCH_TRACE",
                       os.path.join(REPO, "..", "shared", "traces", "synthetic_trace.jsonl"))
EPOCHS = int(os.environ.get("KVR_BENCH_EPOCHS", "2"))
ENGINES = int(os.environ.get("KVR_BENCH_ENGINES", "8"))
BS = int(os.environ.get("KVR_BENCH_BLOCK_SIZE", "16"))
CACHE = int(os.environ.get("KVR_BENCH_CACHE_BLOCKS", "16384"))
WRITERS = int(os.environ.get("KVR_BENCH_WRITERS", "2"))
MODEL = "bench/model"  # bench_publisher's default
READY_RE = re.compile(r"kvrouterd ready((?: [A-Za-z0-9_.-]+=[^\s\"]*)*)")
MiB = 1 << 20
M64 = (1 << 64) - 1


def fail(msg):
    print("budget bench: FAILED: %s" % msg)
    sys.exit(1)


class Daemon:
    def __init__(self, max_memory=0):
        self.tmp = tempfile.mkdtemp(prefix="kvr-bench-budget-")
        conf = os.path.join(self.tmp, "kvrouterd.conf")
        with open(conf, "w") as f:
            f.write("[log]\nlevel = info\n"
                    "[events]\nbind = tcp://127.0.0.1:*\nwriter_threads = %d\nrcvhwm = 0\n"
                    "[index]\nmax_memory = %d\n"
                    "[http]\nlisten = 127.0.0.1:0\n" % (WRITERS, max_memory))
        self.err = open(os.path.join(self.tmp, "stderr.log"), "w+")
        self.proc = subprocess.Popen([BIN, "-c", conf], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 15
        ready = None
        while time.monotonic() < deadline and ready is None:
            time.sleep(0.05)
            with open(self.err.name) as f:
                m = READY_RE.search(f.read())
            if m:
                ready = dict(t.partition("=")[::2] for t in m.group(1).split())
            if self.proc.poll() is not None:
                break
        if ready is None or "http" not in ready or "events" not in ready:
            self.stop()
            fail("daemon not ready")
        self.http = ready["http"]
        self.events = ready["events"].split(",")[0]

    def get(self, path):
        with urllib.request.urlopen("http://%s%s" % (self.http, path), timeout=5) as r:
            return r.read().decode()

    def metrics(self):
        out = {}
        for line in self.get("/metrics").splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def rss(self):
        """(VmRSS, VmHWM) in bytes."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            text = f.read()
        return tuple(int(re.search(r"%s:\s+(\d+) kB" % k, text).group(1)) * 1024
                     for k in ("VmRSS", "VmHWM"))

    def log(self):
        with open(self.err.name) as f:
            return f.read()

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


def splitmix(x):
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def trace_prompts(n, max_tokens=4096):
    """The first n requests' token ids as bench_publisher expands them in epoch 0."""
    salt = splitmix(0xabcdef)
    out = []
    with open(TRACE) as f:
        for line in f:
            r = json.loads(line)
            ntok = min(r["input_length"], len(r["hash_ids"]) * 512, max_tokens)
            toks = [splitmix((r["hash_ids"][i // 512] << 10) ^ (i % 512) ^ salt) % 150000
                    for i in range(ntok)]
            out.append(toks)
            if len(out) == n:
                break
    return out


class Scorer(threading.Thread):
    """POST /v1/score in a loop over a few trace prompts until stopped."""

    def __init__(self, d, prompts):
        super().__init__(daemon=True)
        self.d, self.stop_ev = d, threading.Event()
        self.bodies = [json.dumps({"model": MODEL, "token_ids": p}).encode() for p in prompts]
        self.lat, self.bad, self.best = [], 0, 0

    def run(self):
        i = 0
        while not self.stop_ev.is_set():
            body = self.bodies[i % len(self.bodies)]
            i += 1
            t0 = time.perf_counter()
            try:
                req = urllib.request.Request("http://%s/v1/score" % self.d.http, data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    ans = json.loads(r.read())
                self.lat.append(time.perf_counter() - t0)
                self.best = max([self.best] + [s["matched_blocks"] for s in ans["scores"]])
            except Exception:  # noqa: BLE001 (a non-200 or a dropped connection: counted)
                self.bad += 1
            time.sleep(0.005)


def run(max_memory, prompts):
    d = Daemon(max_memory)
    try:
        base = d.metrics()["kvrouter_index_memory_bytes"]
        samples, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    m = d.metrics()
                    samples.append((time.time(), m["kvrouter_index_memory_bytes"],
                                    m["kvrouter_events_batches_total"]))
                except OSError:
                    pass
                time.sleep(0.02)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        sc = Scorer(d, prompts)
        sc.start()
        p = subprocess.Popen([PUB, "--endpoint", d.events, "--trace", TRACE, "--engines",
                              str(ENGINES), "--block-size", str(BS), "--cache-blocks", str(CACHE),
                              "--epochs", str(EPOCHS)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        line = p.stdout.readline()
        if not line:
            stop.set()
            fail("publisher: %s" % p.stderr.read())
        res = json.loads(line)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (samples and samples[-1][2] >= res["sent"]):
            time.sleep(0.02)
        time.sleep(0.1)
        stop.set()
        sc.stop_ev.set()
        th.join()
        sc.join(10)
        p.wait(60)
        m = d.metrics()
        rss, hwm = d.rss()
        warnings = d.log().count("at [index] max_memory")
    finally:
        d.stop()
    if m.get("kvrouter_events_batches_total", 0) < res["sent"]:
        fail("only %d of %d batches applied" % (m.get("kvrouter_events_batches_total", 0),
                                                res["sent"]))
    return {"base": base, "peak": max(s[1] for s in samples), "m": m, "res": res, "hwm": hwm,
            "rss": rss, "lat": sorted(sc.lat), "bad": sc.bad, "best": sc.best, "warnings": warnings,
            "samples": samples}


def report(name, r, cap=0):
    m, lat = r["m"], r["lat"]
    states = {k[len('kvrouter_events_streams{state="'):-2]: int(v) for k, v in m.items()
              if k.startswith('kvrouter_events_streams{')}
    print("%s: index %.1f MB empty, peak %.1f MB, end %.1f MB; daemon RSS at the end %.1f MB, "
          "peak %.1f MB (with the receive backlog of a publisher at full speed)"
          % (name, r["base"] / 1e6, r["peak"] / 1e6, m["kvrouter_index_memory_bytes"] / 1e6,
             r["rss"] / 1e6, r["hwm"] / 1e6))
    if cap:
        print("  cap %.1f MB: largest excess over it %+.3f MB; stores refused %d events, "
              "%d blocks; %d warning line(s)"
              % (cap / 1e6, (r["peak"] - cap) / 1e6,
                 m.get('kvrouter_events_skipped_total{reason="over_budget"}', 0),
                 m.get("kvrouter_events_blocks_over_budget_total", 0), r["warnings"]))
    print("  blocks stored %d (published %d), removed %d; index holds %d (engines cache %d)"
          % (m["kvrouter_events_blocks_stored_total"], r["res"]["blocks_stored"],
             m["kvrouter_events_blocks_removed_total"], m.get('kvrouter_index_blocks{tier="gpu"}', 0),
             r["res"]["cached_blocks"]))
    print("  streams by state: %s" % ", ".join("%s %d" % kv for kv in states.items() if kv[1]))
    if lat:
        print("  /v1/score during the run: %d answers, %d failed, p50 %.2f ms, p99 %.2f ms, "
              "best match %d blocks"
              % (len(lat), r["bad"], lat[len(lat) // 2] * 1e3,
                 lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, r["best"]))


def main():
    for f in (BIN, PUB, TRACE):
        if not os.path.exists(f):
            fail("missing %s" % f)
    print("budget bench: %d engines, block_size %d, %d cache blocks per engine, %d epoch(s) of "
          "%s, %d writer threads" % (ENGINES, BS, CACHE, EPOCHS, os.path.basename(TRACE),
                                     WRITERS))
    prompts = trace_prompts(8)
    free = run(0, prompts)
    report("no cap", free)
    cap = int(free["base"] + (free["peak"] - free["base"]) / 2) // 1024 * 1024
    capped = run(cap, prompts)
    report("max_memory = %d" % cap, capped, cap)
    problems = []
    cm = capped["m"]
    for name, r in (("uncapped", free), ("capped", capped)):
        if r["m"].get("kvrouter_events_gaps_total", -1) != 0:
            problems.append("%s: gaps" % name)
        if r["bad"]:
            problems.append("%s: %d /v1/score calls failed" % (name, r["bad"]))
    if cm.get('kvrouter_events_skipped_total{reason="over_budget"}', 0) == 0:
        problems.append("no store refused under the cap")
    if capped["peak"] > cap + WRITERS * 2 * MiB + MiB:
        problems.append("index passed the cap by %.1f MB" % ((capped["peak"] - cap) / 1e6))
    if free["m"].get('kvrouter_events_skipped_total{reason="over_budget"}', 0) != 0:
        problems.append("stores refused without a cap")
    if problems:
        fail("; ".join(problems))
    print("budget bench: ok (the cap held; figures reported, not gated)")


if __name__ == "__main__":
    main()
