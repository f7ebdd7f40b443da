"""Replicas and first-contact benchmark driver (run by bench/replicas.sh).

1. Forward: bench_publisher replays the trace at full speed into a primary (SUB bound on
   127.0.0.1:*); with no forward socket, with [events] forward and a subscriber that only
   drains it (forward's own cost), and with forward and one replica daemon connected to it
   (on a small machine the replica competes with the primary for the CPU). Reported per run: the primary's applied rate (batches/s, blocks/s, from
   the publisher's start to the last batch applied), the replica's (to its last batch), the
   forwarded and dropped counts; checks that both indexes hold what the engines cache.
2. First contact: a vllm_pub engine (tests/integration/vllm_pub.py) publishes KVR_BENCH_RING
   batches (its whole ring) before any kvrouterd listens; then a kvrouterd in bind mode with
   bind_replay starts, the engine publishes one more batch, and the time from that batch to
   the stream being synced at it (the replay of the whole ring applied) is measured, with the
   replay's batch rate and whether the index equals the engine's cache.
Figures vary with the machine; nothing is asserted beyond correctness.
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from kvrharness import free_port  # noqa: E402
BUILD = os.environ.get("BUILD", "build/release")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(REPO, BUILD)
BIN = os.path.join(BUILD, "kvrouterd")
PUB = os.path.join(BUILD, "bench", "bench_publisher")
TRACE = os.environ.get("KVR_BENCH_TRACE",
                       os.path.join(REPO, "..", "shared", "traces", "synthetic_trace.jsonl"))
ENGINES = int(os.environ.get("KVR_BENCH_ENGINES", "8"))
BS = int(os.environ.get("KVR_BENCH_BLOCK_SIZE", "16"))
CACHE = int(os.environ.get("KVR_BENCH_CACHE_BLOCKS", "16384"))
RING = int(os.environ.get("KVR_BENCH_RING", "10000"))
RUNS = int(os.environ.get("KVR_BENCH_RUNS", "3"))
READY_RE = re.compile(r"kvrouterd ready((?: [A-Za-z0-9_.-]+=[^\s\"]*)*)")


def fail(msg):
    print("replicas bench: FAILED: %s" % msg)
    sys.exit(1)


class Daemon:
    def __init__(self, events):
        self.tmp = tempfile.mkdtemp(prefix="kvr-bench-")
        conf = os.path.join(self.tmp, "kvrouterd.conf")
        with open(conf, "w") as f:
            f.write("[log]\nlevel = info\n[events]\n%s\nrcvhwm = 0\n"
                    "[http]\nlisten = 127.0.0.1:0\n" % events)
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
        if ready is None or "http" not in ready:
            with open(self.err.name) as f:
                log = f.read()[-2000:]
            self.stop()
            fail("daemon not ready:\n" + log)
        self.http = ready["http"]
        self.events = ready.get("events", "").split(",")[0]

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

    def pods(self):
        return json.loads(self.get("/v1/pods"))["pods"]

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


def wait_batches(d, n, timeout=600):
    """Wall time at which d has applied n batches (polled every 10 ms), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if d.metrics().get("kvrouter_events_batches_total", 0) >= n:
            return time.time()
        time.sleep(0.01)
    return None


class Drain:
    """A subscriber to the forward socket that only counts messages (the cost of forward
    itself, without a second daemon competing for the CPU)."""

    def __init__(self, endpoint):
        import threading
        import zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.n = 0
        self.stop = False
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        import zmq
        while not self.stop:
            if self.sock.poll(50):
                while True:
                    try:
                        self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.n += 1

    def close(self):
        self.stop = True
        self.th.join(5)
        self.sock.close(0)
        self.ctx.term()


def forward_run(with_forward, drain_only=False):
    fport = free_port()
    ev = "bind = tcp://127.0.0.1:*"
    if with_forward:
        ev += "\nforward = tcp://127.0.0.1:%d" % fport
    primary = Daemon(ev)
    replica = drain = None
    try:
        if with_forward:
            if drain_only:
                drain = Drain("tcp://127.0.0.1:%d" % fport)
            else:
                replica = Daemon("connect = tcp://127.0.0.1:%d" % fport)
            deadline = time.monotonic() + 10
            while primary.metrics().get("kvrouter_events_forward_subscriptions_total", 0) < 1:
                if time.monotonic() > deadline:
                    fail("the replica never subscribed")
                time.sleep(0.02)
            time.sleep(0.2)
        p = subprocess.Popen([PUB, "--endpoint", primary.events, "--trace", TRACE,
                              "--engines", str(ENGINES), "--block-size", str(BS),
                              "--cache-blocks", str(CACHE), "--epochs", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        line = p.stdout.readline()
        if not line:
            fail("publisher: %s" % p.stderr.read())
        res = json.loads(line)
        t_primary = wait_batches(primary, res["sent"])
        t_replica = wait_batches(replica, res["sent"]) if replica else None
        p.wait(60)
        if t_primary is None or (replica and t_replica is None):
            fail("not every batch applied")
        out = {"sent": res["sent"], "blocks": res["blocks_stored"],
               "primary_s": t_primary - res["publish_start_wall"]}
        m = primary.metrics()
        for d in [primary] + ([replica] if replica else []):
            held = d.metrics().get('kvrouter_index_blocks{tier="gpu"}', -1)
            if held != res["cached_blocks"]:
                fail("an index holds %d blocks, the engines cache %d" % (held,
                                                                         res["cached_blocks"]))
        if with_forward:
            out["forwarded"] = m.get("kvrouter_events_forwarded_total", 0)
            out["dropped"] = m.get("kvrouter_events_forward_dropped_total", 0)
        if replica:
            out["replica_s"] = t_replica - res["publish_start_wall"]
        return out
    finally:
        if replica:
            replica.stop()
        if drain:
            drain.close()
        primary.stop()


def first_contact_run(seed):
    from vllm_pub import Engine, tokens_for

    sub, rep = free_port(), free_port()
    rng = random.Random(seed)
    system = tokens_for(seed, 32 * BS)  # a 512-token system prompt
    with Engine(pod="127.0.0.1", model="bench/m", mode="connect",
                endpoints=["tcp://127.0.0.1:%d" % sub], replay=True,
                replay_bind="tcp://127.0.0.1:%d" % rep, block_size=BS, num_blocks=4096,
                buffer_steps=RING) as eng:
        r = eng.rank(0)
        for _ in range(RING - 1):  # the engine's whole ring (with the next batch), unheard
            r.request(system + tokens_for(rng.randrange(1 << 30), rng.randint(1, 8) * BS))
            r.publish()
        d = Daemon("bind = tcp://127.0.0.1:%d\nbind_replay = tcp://{pod}:{%d+rank}"
                   "\nreplay_timeout = 60s" % (sub, rep))
        try:
            eng.wait_subscriber()
            t0 = time.time()
            last = r.publish()
            deadline = time.monotonic() + 120
            entry = None
            while time.monotonic() < deadline:
                entry = next((p for p in d.pods() if p["pod"] == "127.0.0.1"), None)
                if entry and entry["last_seq"] == last and entry["state"] != "replaying":
                    break
                time.sleep(0.005)
            dt = time.time() - t0
            if entry is None or entry["last_seq"] != last:
                fail("first contact did not finish: %r" % entry)
            m = d.metrics()
            return {"batches": last + 1, "seconds": dt, "state": entry["state"],
                    "blocks": entry["blocks"], "engine_blocks": len(r.cache.cached),
                    "replayed": m.get("kvrouter_events_replayed_batches_total", 0)}
        finally:
            d.stop()


def main():
    for exe in (BIN, PUB):
        if not os.access(exe, os.X_OK):
            fail("%s not built" % exe)
    print("forward (%d engines, trace %s, one epoch, full speed):" % (ENGINES,
                                                                      os.path.basename(TRACE)))
    for i in range(RUNS):
        a = forward_run(False)
        c = forward_run(True, drain_only=True)
        b = forward_run(True)
        print("  run %d: primary alone %.0f batches/s (%.0f blocks/s); forward to a draining "
              "SUB: %.0f batches/s (forwarded %d, dropped %d); forward + 1 replica daemon: "
              "primary %.0f batches/s, replica %.0f batches/s (its last batch %.2f s after "
              "the primary's), forwarded %d, dropped %d"
              % (i + 1, a["sent"] / a["primary_s"], a["blocks"] / a["primary_s"],
                 c["sent"] / c["primary_s"], c["forwarded"], c["dropped"],
                 b["sent"] / b["primary_s"], b["sent"] / b["replica_s"],
                 b["replica_s"] - b["primary_s"], b["forwarded"], b["dropped"]))
    print("first contact (ring of %d batches, 512-token system prompt, bind_replay):" % RING)
    for i in range(RUNS):
        r = first_contact_run(100 + i)
        ok = r["blocks"] == r["engine_blocks"] and r["state"] == "synced"
        print("  run %d: %d batches replayed in %.3f s (%.0f batches/s), state %s, index %d "
              "blocks, engine %d%s"
              % (i + 1, r["replayed"], r["seconds"], r["replayed"] / r["seconds"], r["state"],
                 r["blocks"], r["engine_blocks"], "" if ok else "  <-- MISMATCH"))


if __name__ == "__main__":
    main()
