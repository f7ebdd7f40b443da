#!/usr/bin/python3
"""soak — a long fault campaign against the real kvrouterd on loopback (issue #27).

Not part of `make test` or CI: `make soak SOAK_SECONDS=1800` (or run this file directly;
`--help`). Everything runs on 127.0.0.1 and stops by itself after --duration seconds.

What runs:
* engines: vLLM emulators (tests/integration/vllm_pub.py: PUB + replay ROUTER per DP rank, a
  prefix-cache model with LRU eviction), some with 2 DP ranks, bound on loopback and dialed
  by the daemons ([events] connect ... replay=...). A driver thread replays the Mooncake-style
  trace (../shared/traces/synthetic_trace.jsonl: each hash id is 512 deterministic token ids,
  prompts cut at --max-hash-ids ids) at its own pace, each request on an engine chosen by
  /v1/route of a live daemon (else at random), one batch per request;
* faults (a chaos thread, seeded): batches dropped on the live socket (kept in the ring: the
  next batch reveals the gap and the daemon replays it), engines restarting (seq back to 0,
  empty cache and ring, the PUB socket closed and bound again), engines going silent for a
  while and coming back, the primary daemon killed with SIGKILL every --kill-every seconds
  (+-30%) and restarted from its [state] dir (periodic snapshots), a second replica started
  with [state] bootstrap = the primary's admin listener and kept until the end;
* gateway traffic from client threads: /v1/score (checked, below), /v1/route (token ids,
  policies, tracked requests and their DELETE, sessions) and, when the reference tokenizers
  are present (build/tokref, `make deps`), /v1/tokenize of a 20k-word document, prompt text
  and OpenAI chat bodies through /v1/score and /v1/route (every answer for one body must stay
  the same across restarts);
* checks, all the time: a /v1/score answer is compared, worker by worker, with the engines'
  true caches (the emulator's prefix-cache model) for the workers whose stream is `synced` at
  the engine's last published seq in /v1/pods before and after the score and whose engine did
  not publish meanwhile; every --settle-every seconds the driver pauses, every engine that is
  not silent publishes an empty batch (so dropped batches show up as gaps), and once every
  stream of both daemons is synced at its engine's last seq (bounded wait) every worker is
  compared on a sample of prompts; /healthz of each daemon every 100 ms (a failure counts
  unless the daemon is in a planned kill/start window); RSS and open descriptors of each
  daemon from /proc every 5 s (series printed; the long-lived replica's must stay flat after
  warm-up); no sanitizer report in any daemon's stderr; every SIGTERM exit 0.

Prints a summary and exits 1 on any failure (mismatch, healthz failure outside a window,
client error outside a window, settle timeout, sanitizer report, unclean exit, a restart
that did not load its snapshot, a bootstrap that did not come from the peer, growth of RSS
or descriptors, no check done). Seeded: the seed is printed; --seed replays the schedule
(thread timing is not replayed).

Engine restarts are kept out of the window from 12 s before a kill or a replica start to 5 s
after the daemons are back: an engine that restarted after the snapshot a daemon comes back
from, and published past the saved seq before the daemon reconnected, is indistinguishable
from a gap (docs/operations.md, "Not recovered"); that is a documented limit, not a finding.
"""

import argparse
import array
import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import http.client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import zmq  # noqa: E402

import kvrharness  # noqa: E402
from vllm_pub import Engine  # noqa: E402

MODEL = "Qwen/Qwen3-8B"
BS = 16
HASH_ID_TOKENS = 512
VOCAB = 150000
TRACE = os.path.join(os.path.dirname(REPO), "shared", "traces", "synthetic_trace.jsonl")
DOC = os.path.join(REPO, "tests", "data", "tok", "doc20k.txt")


def now():
    return time.monotonic()


def log(msg):
    sys.stdout.write("[%s] %s\n" % (time.strftime("%H:%M:%S", time.gmtime()), msg))
    sys.stdout.flush()


# ---- trace ---------------------------------------------------------------------------------

_seg_cache = collections.OrderedDict()


def hash_id_tokens(hid):
    """512 deterministic token ids for a Mooncake hash id (as bench/fleet_work.py)."""
    a = _seg_cache.get(hid)
    if a is None:
        raw = hashlib.shake_128(b"soak-%d" % hid).digest(4 * HASH_ID_TOKENS)
        a = array.array("I")
        a.frombytes(raw)
        a = array.array("I", (x % VOCAB for x in a))
        _seg_cache[hid] = a
        if len(_seg_cache) > 4096:
            _seg_cache.popitem(last=False)
    else:
        _seg_cache.move_to_end(hid)
    return a


def load_trace(path, max_ids):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            ids = r["hash_ids"][:max_ids]
            n = min(r["input_length"], len(ids) * HASH_ID_TOKENS)
            out.append((r["timestamp"] / 1000.0, ids, n))
    return out


def prompt_tokens(ids, n):
    a = array.array("I")
    for h in ids:
        a.extend(hash_id_tokens(h))
    return a[:n]


# ---- HTTP ----------------------------------------------------------------------------------

class HttpError(Exception):
    pass


def http_req(port, method, path, body=None, timeout=10.0, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, data
    finally:
        conn.close()


def http_json(port, method, path, body=None, timeout=10.0):
    st, data = http_req(port, method, path, body, timeout)
    try:
        obj = json.loads(data) if data else None
    except ValueError:
        obj = None
    return st, obj


def proc_stats(pid):
    """(rss_kib, open fds) of a process, or None."""
    try:
        rss = None
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return rss, fds
    except (OSError, ValueError):
        return None


def proc_cpu(pid):
    """User + system CPU seconds of a process, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def parse_metrics(text, names):
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            try:
                out[name] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


METRICS = ("kvrouter_events_gaps_total", "kvrouter_events_replays_total",
           "kvrouter_events_replayed_batches_total", "kvrouter_events_restarts_total",
           "kvrouter_snapshot_total", "kvrouter_snapshot_failures_total")


# ---- the campaign --------------------------------------------------------------------------

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = collections.Counter()
        self.failures = []
        self.mismatch_examples = []

    def inc(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def fail(self, what):
        with self.lock:
            self.c["failures"] += 1
            if len(self.failures) < 50:
                self.failures.append("%s %s" % (time.strftime("%H:%M:%S", time.gmtime()), what))
        log("FAIL " + what)


class Slot:
    """One daemon role (primary "A" or replica "B") across its process lives."""

    def __init__(self, soak, name):
        self.soak = soak
        self.name = name
        self.dir = os.path.join(soak.workdir, name)
        self.state_dir = os.path.join(self.dir, "state")
        os.makedirs(self.state_dir, exist_ok=True)
        self.d = None
        self.life = 0
        self.window = True  # planned: not up (killed, starting, stopped)
        self.up_since = None
        self.lives = []  # dicts: pid, kind, start, end, series [(t, rss, fds)], metrics
        self.lock = threading.Lock()

    def config(self, bootstrap=None):
        s = self.soak
        conf = {"log": {"level": "info"},
                "events": {"bind": None, "connect": s.connect_lines()},
                "http": {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"},
                "state": {"dir": self.state_dir,
                          "snapshot_interval": "%gs" % s.args.snapshot_interval},
                "daemon": {"shutdown_timeout": "5s"}}
        if bootstrap:
            conf["state"]["bootstrap"] = bootstrap
        if s.tokref:
            conf['model "%s"' % MODEL] = {"tokenizer": os.path.join(s.tokref, "qwen3")}
        return conf

    def start(self, kind, bootstrap=None):
        with self.lock:
            self.window = True
        t0 = now()
        d = kvrharness.Daemon(self.config(bootstrap), tmpdir=self.dir, ready_timeout=180)
        err = d.stderr_text()
        life = {"pid": d.pid, "kind": kind, "start": t0 - self.soak.t0, "end": None,
                "ready_s": now() - t0, "series": [], "metrics": {}, "exit": None}
        if kind == "restart":
            if "snapshot loaded from " + self.state_dir not in err:
                self.soak.stats.fail("%s pid %d restarted without loading its snapshot"
                                     % (self.name, d.pid))
            self.soak.stats.inc("restarts_from_snapshot")
        elif kind == "bootstrap":
            if "snapshot loaded from http://" not in err:
                self.soak.stats.fail("%s pid %d: bootstrap did not load the peer's snapshot"
                                     % (self.name, d.pid))
            m = re.search(r"recovery: bootstrap: (\d+) bytes from \S+ in ([0-9.]+) s", err)
            if m:
                life["bootstrap_bytes"] = int(m.group(1))
                life["bootstrap_s"] = float(m.group(2))
            self.soak.stats.inc("bootstraps")
        with self.lock:
            self.d = d
            self.life += 1
            self.lives.append(life)
            self.window = False
            self.up_since = now()
        log("%s up: pid %d (%s) in %.2f s, http %d admin %d"
            % (self.name, d.pid, kind, life["ready_s"], d.http_port, d.admin_port))
        return d

    def _end_life(self, code):
        d = self.d
        life = self.lives[-1]
        life["end"] = now() - self.soak.t0
        life["exit"] = code
        text = d.stderr_text()
        with open(os.path.join(self.dir, "stderr-%d.log" % d.pid), "w") as f:
            f.write(text)
        marker = kvrharness.sanitizer_report(text)
        if marker:
            i = text.find(marker)
            self.soak.stats.fail("%s pid %d: sanitizer report (%s): %s" % (
                self.name, d.pid, marker, text[max(0, i - 200):i + 2000]))
        self.soak.stats.inc("sanitizer_scanned_lives")

    def kill(self):
        with self.lock:
            self.window = True
            d = self.d
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        d.exit_code = -9
        d._join_reader()
        self._end_life(-9)
        self.soak.stats.inc("kills")
        log("%s pid %d killed (SIGKILL)" % (self.name, d.pid))

    def stop(self):
        with self.lock:
            self.window = True
            d = self.d
        if d is None:
            return
        code = d.stop(timeout=30)
        self._end_life(code)
        if code != 0:
            self.soak.stats.fail("%s pid %d exited with %s after SIGTERM" % (self.name, d.pid, code))
        elif "snapshot written" not in d.stderr_text():
            self.soak.stats.fail("%s pid %d wrote no shutdown snapshot" % (self.name, d.pid))
        log("%s pid %d stopped (SIGTERM): exit %s" % (self.name, d.pid, code))

    def current(self):
        """(daemon, life id) when up, else (None, life)."""
        with self.lock:
            if self.window or self.d is None:
                return None, self.life
            return self.d, self.life

    def excused(self, life):
        with self.lock:
            return self.window or self.life != life


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.stats = Stats()
        self.stop_ev = threading.Event()
        self.workdir = tempfile.mkdtemp(prefix="kvr-soak-", dir=args.workdir)
        self.tokref = None
        tr = args.tokref or os.path.join(REPO, "build", "tokref")
        if not args.no_text and os.path.exists(os.path.join(tr, "qwen3", "tokenizer.json")):
            self.tokref = tr
        self.trace = load_trace(args.trace, args.max_hash_ids)
        with open(kvrharness.kvr_bin(), "rb") as f:
            self.asan = b"__asan_init" in f.read()
        self.ctx = zmq.Context()
        self.engines = []
        for i in range(args.engines):
            dp = 2 if i < args.dp_engines else 1
            eng = Engine(pod="eng-%d" % i, model=MODEL, dp_size=dp, mode="bind", replay=True,
                         block_size=BS, num_blocks=args.num_blocks, ctx=self.ctx)
            eng.lock = threading.Lock()
            eng.version = 0          # bumped by every publish and restart (under eng.lock)
            eng.silent_until = 0.0
            eng.restarts = 0
            self.engines.append(eng)
        self.pause = threading.Event()  # set: the driver does not publish
        self.driver_idle = threading.Event()
        # prompts (array('I')) for the checks: the latest ones, and a uniform sample of all
        # (older prompts, whose blocks were evicted since, test removals)
        self.recent = collections.deque(maxlen=300)
        self.reservoir = []
        self.nprompts = 0
        self.recent_lock = threading.Lock()
        self.no_restart_until = 0.0
        self.A = Slot(self, "A")
        self.B = Slot(self, "B")
        self.t0 = now()
        self.threads = []
        self.healthz_fail_window = collections.Counter()
        self.last_settle = None

    def connect_lines(self):
        return ["%s replay=%s" % (r.pub_endpoint, r.replay_endpoint)
                for e in self.engines for r in e.ranks]

    def slots(self):
        return (self.A, self.B)

    def up_daemons(self):
        out = []
        for s in self.slots():
            d, life = s.current()
            if d is not None:
                out.append((s, d, life))
        return out

    # ---- engines --------------------------------------------------------------------------
    def publish(self, eng, rank, drop=False):
        """Under eng.lock."""
        rank.publish(drop=drop)
        eng.version += 1
        self.stats.inc("batches")
        if drop:
            self.stats.inc("batches_dropped")

    def reopen_pub(self, rank):
        ep = rank.pub_endpoint
        rank.pub.close(0)
        last = None
        for _ in range(100):
            s = self.ctx.socket(zmq.XPUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.XPUB_VERBOSE, 1)
            s.setsockopt(zmq.SNDHWM, rank.engine.hwm)
            s.setsockopt(zmq.RCVHWM, rank.engine.hwm)
            try:
                s.bind(ep)
                rank.pub = s
                return
            except zmq.ZMQError as e:
                last = e
                s.close(0)
                time.sleep(0.05)
        raise RuntimeError("cannot bind %s again: %s" % (ep, last))

    def engine_restart(self, eng):
        with eng.lock:
            for r in eng.ranks:
                r.restart()
                self.reopen_pub(r)
            eng.version += 1
            eng.restarts += 1
        self.stats.inc("engine_restarts")
        log("engine %s restarted (seq 0, empty cache, socket bound again)" % eng.pod)

    def drain_subs(self):
        for e in self.engines:
            with e.lock:
                for r in e.ranks:
                    try:
                        while r.pub.poll(0):
                            r.pub.recv()
                    except zmq.ZMQError:
                        pass

    def choose_engine(self, toks):
        ups = self.up_daemons()
        live = [e for e in self.engines if e.silent_until <= now()]
        if not live:
            return None, None
        if ups and self.rng.random() < 0.5:
            s, d, life = self.rng.choice(ups)
            body = {"model": MODEL, "token_ids": toks.tolist(),
                    "candidates": [{"pod": e.pod, "dp_rank": r.rank}
                                   for e in live for r in e.ranks]}
            try:
                st, res = http_json(d.http_port, "POST", "/v1/route", body)
                self.stats.inc("route_driver")
                if st == 200:
                    for e in live:
                        if e.pod == res["pod"] and res["dp_rank"] < len(e.ranks):
                            return e, e.ranks[res["dp_rank"]]
                elif st != 503 and not s.excused(life):
                    self.stats.fail("driver /v1/route on %s: %d %r" % (s.name, st, res))
            except (OSError, http.client.HTTPException) as ex:
                if not s.excused(life):
                    self.stats.fail("driver /v1/route on %s: %r" % (s.name, ex))
        e = self.rng.choice(live)
        return e, self.rng.choice(e.ranks)

    def driver(self):
        """Replays the trace at its pace (looping), one batch per request."""
        rng = random.Random(self.args.seed + 1)
        i = 0
        loop = 0
        base = now()
        speed = self.args.speed
        while not self.stop_ev.is_set():
            if self.pause.is_set():
                self.driver_idle.set()
                time.sleep(0.02)
                base += 0.02
                continue
            self.driver_idle.clear()
            ts, ids, n = self.trace[i]
            due = base + ts / speed
            wait = due - now()
            if wait > 0:
                time.sleep(min(wait, 0.1))
                continue
            i += 1
            if i == len(self.trace):
                i = 0
                loop += 1
                base = now()
            toks = prompt_tokens(ids, n)
            eng, rank = self.choose_engine(toks)
            if eng is None:
                continue
            drop = rng.random() < self.args.drop_rate
            with eng.lock:
                hit, stored, removed = rank.request(toks.tolist())
                if removed and rng.random() < self.args.lose_removals:
                    # --lose-removals (a self-test): the daemon never hears of an eviction
                    # the engine made, as a lost event would; the checks must catch it
                    rank.pending = [ev for ev in rank.pending
                                    if not (isinstance(ev, dict) and ev["type"] == "BlockRemoved")]
                    self.stats.inc("removals_lost_on_purpose")
                self.publish(eng, rank, drop=drop)
            self.stats.inc("requests")
            self.stats.inc("blocks_hit", hit)
            self.stats.inc("blocks_stored", len(stored))
            self.stats.inc("blocks_evicted", len(removed))
            with self.recent_lock:
                self.recent.append(toks)
                self.nprompts += 1
                if len(self.reservoir) < 300:
                    self.reservoir.append(toks)
                else:
                    j = rng.randrange(self.nprompts)
                    if j < 300:
                        self.reservoir[j] = toks
        self.driver_idle.set()

    # ---- checks ---------------------------------------------------------------------------
    def engine_view(self, chain):
        """{(pod, rank): (expected blocks, seq, version)} under each engine's lock."""
        out = {}
        for e in self.engines:
            with e.lock:
                for r in e.ranks:
                    k = 0
                    for h in chain:
                        if r.cache.lookup(h) is None:
                            break
                        k += 1
                    out[(e.pod, r.rank)] = (k, r.seq, e.version)
        return out

    def pods_of(self, d):
        st, res = http_json(d.admin_port, "GET", "/v1/pods")
        if st != 200:
            raise HttpError("/v1/pods: %d" % st)
        return {(p["pod"], p["dp_rank"]): p for p in res["pods"] if p["model"] == MODEL}

    def check_one(self, slot, d, life, toks, settled=False):
        """One score compared with the engines; returns (workers compared, mismatches)."""
        chain = self.engines[0].rank(0).chain(toks.tolist())
        view = self.engine_view(chain)
        p1 = self.pods_of(d)
        st, res = http_json(d.http_port, "POST", "/v1/score",
                            {"model": MODEL, "token_ids": toks.tolist()})
        if st != 200:
            raise HttpError("/v1/score: %d %r" % (st, res))
        p2 = self.pods_of(d)
        view2 = {}
        for e in self.engines:
            with e.lock:
                for r in e.ranks:
                    view2[(e.pod, r.rank)] = e.version
        got = {(x["pod"], x["dp_rank"]): x["matched_blocks"] for x in res["scores"]}
        compared = mism = 0
        for w, (want, seq, ver) in view.items():
            if view2[w] != ver:
                continue
            s1, s2 = p1.get(w), p2.get(w)
            if seq == 0:  # never published in this run of the engine: nothing announced
                continue
            if s1 is None or s2 is None:
                if settled:
                    self.stats.fail("%s: settled but no stream for %s" % (slot.name, w))
                continue
            if not (s1["state"] == s2["state"] == "synced" and
                    s1["last_seq"] == s2["last_seq"] == seq - 1):
                continue
            compared += 1
            if want:
                self.stats.inc("worker_checks_nonzero")
            if got.get(w, 0) != want:
                mism += 1
                self.stats.inc("mismatches")
                detail = ("%s pid %d: worker %s matched %d, engine holds %d (prompt %d blocks; "
                          "stream %s)" % (slot.name, d.pid, w, got.get(w, 0), want, len(chain),
                                          json.dumps(s2)))
                self.stats.fail("mismatch " + detail)
        self.stats.inc("score_checks")
        self.stats.inc("worker_checks", compared)
        if settled:
            self.stats.inc("worker_checks_settled", compared)
        return compared, mism

    def sample_prompt(self, rng):
        with self.recent_lock:
            if not self.recent:
                return None
            p = rng.choice(self.recent if rng.random() < 0.5 else self.reservoir)
        r = rng.random()
        if r < 0.5:
            return p
        if r < 0.85:  # a prefix, maybe with a foreign tail
            cut = rng.randint(1, max(1, len(p) // BS)) * BS
            q = array.array("I", p[:cut])
            if rng.random() < 0.5:
                q.extend(rng.randrange(VOCAB) for _ in range(rng.randint(1, 3) * BS))
            return q
        return array.array("I", (rng.randrange(VOCAB) for _ in range(rng.randint(1, 40) * BS)))

    def checker(self, tid):
        rng = random.Random(self.args.seed * 31 + tid)
        while not self.stop_ev.is_set():
            ups = self.up_daemons()
            toks = self.sample_prompt(rng)
            if not ups or toks is None or self.pause.is_set():
                time.sleep(0.05)
                continue
            slot, d, life = rng.choice(ups)
            try:
                self.check_one(slot, d, life, toks)
            except (OSError, http.client.HTTPException, HttpError, ValueError, TypeError,
                    KeyError) as ex:
                if slot.excused(life):
                    self.stats.inc("client_errors_in_window")
                else:
                    self.stats.fail("checker on %s pid %d: %r" % (slot.name, d.pid, ex))
            time.sleep(self.args.check_sleep)

    def settle(self):
        """Pause the driver, reveal every drop, wait until every stream of every up daemon
        is synced at its engine's last seq, then compare every worker on sampled prompts."""
        t0 = now()
        self.pause.set()
        try:
            self.driver_idle.wait(10)
            nudged = []
            for e in self.engines:
                if e.silent_until > now():
                    continue
                with e.lock:
                    for r in e.ranks:
                        self.publish(e, r)
                nudged.append(e)
            deadline = now() + self.args.settle_timeout
            pending = None
            while now() < deadline and not self.stop_ev.is_set():
                pending = []
                for slot, d, life in self.up_daemons():
                    try:
                        pods = self.pods_of(d)
                    except (OSError, http.client.HTTPException, HttpError) as ex:
                        pending.append((slot.name, "pods", repr(ex)))
                        continue
                    for e in nudged:
                        for r in e.ranks:
                            s = pods.get((e.pod, r.rank))
                            if s is None or s["state"] != "synced" or s["last_seq"] != r.seq - 1:
                                pending.append((slot.name, e.pod, r.rank, r.seq - 1,
                                                s and (s["state"], s["last_seq"])))
                if not pending:
                    break
                time.sleep(0.1)
            if pending:
                self.stats.fail("settle: not synced within %.0f s: %r"
                                % (self.args.settle_timeout, pending[:6]))
                return
            rng = random.Random(self.rng.random())
            n = 0
            for slot, d, life in self.up_daemons():
                for _ in range(self.args.settle_prompts):
                    toks = self.sample_prompt(rng)
                    if toks is None:
                        break
                    try:
                        c, _ = self.check_one(slot, d, life, toks, settled=True)
                        n += c
                    except (OSError, http.client.HTTPException, HttpError) as ex:
                        if not slot.excused(life):
                            self.stats.fail("settle check on %s: %r" % (slot.name, ex))
            self.stats.inc("settles")
            self.last_settle = now() - t0
            log("settled in %.2f s, %d worker comparisons" % (self.last_settle, n))
        finally:
            self.pause.clear()

    # ---- gateway traffic ------------------------------------------------------------------
    def route_client(self, tid):
        rng = random.Random(self.args.seed * 97 + tid)
        routes = []
        while not self.stop_ev.is_set():
            ups = self.up_daemons()
            toks = self.sample_prompt(rng)
            if not ups or toks is None:
                time.sleep(0.1)
                continue
            slot, d, life = rng.choice(ups)
            body = {"model": MODEL, "token_ids": toks.tolist(),
                    "policy": rng.choice(["ttft", "cost", "cache_aware", "score"])}
            if rng.random() < 0.3:
                body["track"] = True
            if rng.random() < 0.3:
                body["session_id"] = "s%d" % rng.randrange(50)
            try:
                st, res = http_json(d.http_port, "POST", "/v1/route", body)
                self.stats.inc("routes")
                if st == 200:
                    if res.get("route_id"):
                        routes.append((slot, life, res["route_id"]))
                elif st not in (503, 429):
                    raise HttpError("/v1/route: %d %r" % (st, res))
                if len(routes) > 20 or (routes and rng.random() < 0.2):
                    s2, l2, rid = routes.pop(0)
                    d2, cur = s2.current()
                    if d2 is not None and cur == l2:
                        st, _ = http_req(d2.http_port, "DELETE", "/v1/routes/" + rid)
                        if st not in (200, 204, 404):
                            raise HttpError("DELETE /v1/routes: %d" % st)
                        self.stats.inc("routes_deleted")
            except (OSError, http.client.HTTPException, HttpError, ValueError, TypeError,
                    AttributeError) as ex:
                if slot.excused(life):
                    self.stats.inc("client_errors_in_window")
                else:
                    self.stats.fail("route client on %s pid %d: %r" % (slot.name, d.pid, ex))
            time.sleep(self.args.route_sleep)

    def text_client(self):
        rng = random.Random(self.args.seed * 7)
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
        words = doc.split(" ")
        system = "You are a careful assistant. " + " ".join(words[:400])
        known = {}  # key -> tokens / query_blocks first seen: must not change
        while not self.stop_ev.is_set():
            ups = self.up_daemons()
            if not ups:
                time.sleep(0.1)
                continue
            slot, d, life = rng.choice(ups)
            k = rng.randrange(6)
            turns = rng.randint(1, 4)
            msgs = [{"role": "system", "content": system}]
            for t in range(turns):
                msgs.append({"role": "user", "content": "Question %d: %s" % (
                    t, " ".join(words[100 * t:100 * t + 60]))})
                if t < turns - 1:
                    msgs.append({"role": "assistant", "content": "Answer %d." % t})
            try:
                if k == 0:  # a large prompt
                    cut = rng.choice([2000, 8000, len(doc)])
                    key = ("tok", cut)
                    st, res = http_json(d.http_port, "POST", "/v1/tokenize",
                                        {"model": MODEL, "prompt": doc[:cut]}, timeout=30)
                    val = st == 200 and len(res["tokens"])
                elif k == 1:
                    key = ("chat-tok", turns)
                    st, res = http_json(d.http_port, "POST", "/v1/tokenize",
                                        {"model": MODEL, "messages": msgs}, timeout=30)
                    val = st == 200 and len(res["tokens"])
                elif k in (2, 3):  # a raw OpenAI chat body
                    key = ("chat-route", turns)
                    body = {"model": MODEL, "messages": msgs, "stream": True, "max_tokens": 64,
                            "chat_template_kwargs": {"enable_thinking": False}}
                    path = "/v1/route" if k == 2 else "/v1/score"
                    st, res = http_json(d.http_port, "POST", path, body, timeout=30)
                    val = st == 200 and (res.get("tokens") if k == 2 else res.get("query_blocks"))
                    key = key + (k,)
                    if (st == 503 and k == 2) or (st == 200 and k == 3 and
                                                  not res.get("block_size")):
                        val = None  # no candidate; the model's block size not learned yet
                else:  # prompt text through score and route
                    cut = rng.choice([4000, 30000])
                    key = ("prompt", cut, k)
                    path = "/v1/score" if k == 4 else "/v1/route"
                    st, res = http_json(d.http_port, "POST", path,
                                        {"model": MODEL, "prompt": doc[:cut]}, timeout=30)
                    val = st == 200 and (res.get("query_blocks") if k == 4 else res.get("tokens"))
                    if (st == 503 and k == 5) or (st == 200 and k == 4 and
                                                  not res.get("block_size")):
                        val = None
                self.stats.inc("text_requests")
                if st != 200 and not (st == 503 and val is None):
                    raise HttpError("%s: %d %r" % (key, st, res))
                if val is not None:
                    if known.setdefault(key, val) != val:
                        self.stats.fail("text answer changed for %r: %r then %r"
                                        % (key, known[key], val))
            except (OSError, http.client.HTTPException, HttpError, ValueError, TypeError,
                    KeyError, AttributeError) as ex:
                if slot.excused(life):
                    self.stats.inc("client_errors_in_window")
                else:
                    self.stats.fail("text client on %s pid %d: %r" % (slot.name, d.pid, ex))
            time.sleep(self.args.text_sleep)

    def healthz(self):
        while not self.stop_ev.is_set():
            t = now()
            for s in self.slots():
                with s.lock:
                    d, life, window = s.d, s.life, s.window
                if d is None:
                    continue
                ok = False
                try:
                    st, data = http_req(d.http_port, "GET", "/healthz", timeout=2)
                    ok = st == 200
                except (OSError, http.client.HTTPException):
                    pass
                self.stats.inc("healthz_polls")
                if not ok:
                    if s.excused(life) or window:
                        self.healthz_fail_window[s.name] += 1
                    else:
                        self.stats.fail("healthz of %s pid %d failed" % (s.name, d.pid))
                        self.stats.inc("healthz_failures")
            time.sleep(max(0.0, 0.1 - (now() - t)))

    def monitor(self):
        while not self.stop_ev.is_set():
            for s in self.slots():
                d, life = s.current()
                if d is None:
                    continue
                ps = proc_stats(d.pid)
                if ps is None:
                    continue
                rec = s.lives[-1] if s.lives and s.lives[-1]["pid"] == d.pid else None
                if rec is None:
                    continue
                rec["series"].append((round(now() - self.t0, 1), ps[0], ps[1]))
                rec["cpu"] = proc_cpu(d.pid) or rec.get("cpu", 0)
                try:
                    st, data = http_req(d.admin_port, "GET", "/metrics", timeout=5)
                    if st == 200:
                        rec["metrics"] = parse_metrics(data.decode(), METRICS)
                except (OSError, http.client.HTTPException):
                    pass
            self.stop_ev.wait(5)

    # ---- chaos ----------------------------------------------------------------------------
    def next_kill_delay(self):
        k = self.args.kill_every
        return self.rng.uniform(0.7 * k, 1.3 * k)

    def chaos(self):
        args = self.args
        end = self.t0 + args.duration
        b_at = self.t0 + args.duration * args.bootstrap_at
        next_kill = self.t0 + self.next_kill_delay()
        next_settle = self.t0 + args.settle_every
        next_fault = self.t0 + self.rng.uniform(2, 6)
        while now() < end and not self.stop_ev.is_set():
            t = now()
            upcoming = min(next_kill, b_at if not self.B.lives else end)
            if t >= next_kill and now() < end - 20:
                self.A.kill()
                self.drain_subs()
                time.sleep(self.rng.uniform(0.2, args.max_down))
                self.A.start("restart")
                self.no_restart_until = now() + 5
                next_kill = now() + self.next_kill_delay()
                continue
            if not self.B.lives and t >= b_at:
                d, _ = self.A.current()
                if d is not None:
                    self.B.start("bootstrap", bootstrap="http://127.0.0.1:%d" % d.admin_port)
                    self.no_restart_until = now() + 5
                    continue
            if t >= next_settle:
                self.settle()
                next_settle = now() + args.settle_every
                continue
            if t >= next_fault:
                r = self.rng.random()
                eng = self.rng.choice(self.engines)
                if r < 0.35:  # a burst of drops on one rank
                    rank = self.rng.choice(eng.ranks)
                    n = self.rng.randint(1, 8)
                    with eng.lock:
                        for _ in range(n):
                            self.publish(eng, rank, drop=True)
                    self.stats.inc("drop_bursts")
                elif r < 0.6:
                    if t > self.no_restart_until and upcoming - t > 12:
                        self.engine_restart(eng)
                elif r < 0.85:
                    if eng.silent_until <= t and \
                            sum(e.silent_until > t for e in self.engines) < len(self.engines) - 1:
                        eng.silent_until = t + self.rng.uniform(5, 60)
                        self.stats.inc("silences")
                        log("engine %s silent for %.0f s" % (eng.pod, eng.silent_until - t))
                else:
                    self.drain_subs()
                next_fault = now() + self.rng.uniform(1, args.fault_every)
                continue
            time.sleep(0.05)

    # ---- run ------------------------------------------------------------------------------
    def run(self):
        args = self.args
        log("soak: seed %d, %d s, binary %s, %d engines (%d with 2 DP ranks), tokenizer %s, "
            "workdir %s" % (args.seed, args.duration, kvrharness.kvr_bin(), len(self.engines),
                            min(args.dp_engines, len(self.engines)), self.tokref or "none",
                            self.workdir))
        self.A.start("fresh")
        for e in self.engines:
            e.wait_subscriber(30)
            with e.lock:
                for r in e.ranks:
                    self.publish(e, r)  # baseline
        self.t0 = now()
        workers = [threading.Thread(target=self.driver, name="driver"),
                   threading.Thread(target=self.healthz, name="healthz"),
                   threading.Thread(target=self.monitor, name="monitor")]
        workers += [threading.Thread(target=self.checker, args=(i,), name="checker%d" % i)
                    for i in range(args.checkers)]
        workers += [threading.Thread(target=self.route_client, args=(i,), name="route%d" % i)
                    for i in range(args.routers)]
        if self.tokref:
            workers.append(threading.Thread(target=self.text_client, name="text"))
        for w in workers:
            w.daemon = True
            w.start()
        try:
            self.chaos()
            # the end: one last settle with every engine speaking, on both daemons
            for e in self.engines:
                e.silent_until = 0.0
            self.settle()
        except Exception as ex:  # a bug of the script or a daemon that would not start
            self.stats.fail("chaos thread: %r" % ex)
            import traceback
            traceback.print_exc()
        finally:
            self.stop_ev.set()
            for w in workers:
                w.join(30)
            for s in self.slots():
                if s.d is not None and s.d.exit_code is None:
                    s.stop()
            for e in self.engines:
                e.close()
        return self.report()

    def report(self):
        st = self.stats
        c = st.c
        elapsed = now() - self.t0
        print()
        print("==== soak summary (seed %d, %.0f s, %s)" % (self.args.seed, elapsed,
                                                         kvrharness.kvr_bin()))
        eng_replays = sum(r.replay_requests for e in self.engines for r in e.ranks)
        dm = collections.Counter()
        for s in self.slots():
            for life in s.lives:
                for k, v in life["metrics"].items():
                    dm[k] += v
        print("daemon lives: A %d (kills %d, restarts from snapshot %d), B %d (bootstraps %d)"
              % (len(self.A.lives), c["kills"], c["restarts_from_snapshot"], len(self.B.lives),
                 c["bootstraps"]))
        for life in self.B.lives:
            if "bootstrap_bytes" in life:
                print("  B bootstrap: %d bytes in %.3f s" % (life["bootstrap_bytes"],
                                                            life["bootstrap_s"]))
        print("engines: %d requests, %d batches, %d dropped (%d bursts), %d engine restarts, "
              "%d silences, %d replay requests served by the engines' ROUTERs"
              % (c["requests"], c["batches"], c["batches_dropped"], c["drop_bursts"],
                 c["engine_restarts"], c["silences"], eng_replays))
        print("daemons (/metrics, summed over lives, last sample of each): gaps %d, replays %d, "
              "replayed batches %d, stream restarts %d, snapshots %d (failed %d)"
              % tuple(int(dm[m]) for m in METRICS))
        print("engine caches: %d blocks hit, %d stored, %d evicted"
              % (c["blocks_hit"], c["blocks_stored"], c["blocks_evicted"]))
        print("checks: %d scores checked, %d worker comparisons (%d with a cached prefix; %d in "
              "%d settles), %d mismatches"
              % (c["score_checks"], c["worker_checks"], c["worker_checks_nonzero"],
                 c["worker_checks_settled"], c["settles"], c["mismatches"]))
        print("traffic: %d routes (+%d by the driver, %d tracked ended), %d text/chat requests, "
              "%d client errors inside kill/start windows"
              % (c["routes"], c["route_driver"], c["routes_deleted"], c["text_requests"],
                 c["client_errors_in_window"]))
        print("healthz: %d polls, %d failures outside planned windows, %s inside them"
              % (c["healthz_polls"], c["healthz_failures"], dict(self.healthz_fail_window)))
        print("sanitizer: %d daemon lives' stderr scanned" % c["sanitizer_scanned_lives"])
        t = os.times()
        print("cpu: this script %.0f s; daemons %s s" % (
            t.user + t.system, "+".join("%.0f" % life.get("cpu", 0)
                                        for s in self.slots() for life in s.lives)))
        for s in self.slots():
            for life in s.lives:
                ser = life["series"]
                if not ser:
                    continue
                pts = [ser[0], ser[len(ser) // 2], ser[-1]]
                print("  %s pid %d (%s, %.0f-%.0f s): RSS KiB / fds start %s/%s middle %s/%s "
                      "end %s/%s (%d samples)"
                      % (s.name, life["pid"], life["kind"], life["start"],
                         life["end"] if life["end"] is not None else elapsed,
                         pts[0][1], pts[0][2], pts[1][1], pts[1][2], pts[2][1], pts[2][2],
                         len(ser)))
        self.check_flat()
        if c["score_checks"] == 0 or c["worker_checks"] == 0:
            st.fail("no score was checked")
        with open(os.path.join(self.workdir, "series.json"), "w") as f:
            json.dump({s.name: s.lives for s in self.slots()}, f)
        if st.failures:
            print("FAILURES (%d):" % c["failures"])
            for f in st.failures:
                print("  " + f[:3000])
            print("soak: FAILED (workdir kept: %s)" % self.workdir)
            return 1
        print("soak: OK")
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return 0

    def check_flat(self):
        """The longest-lived process: after its first third (warm-up: the engines' caches
        fill), RSS may not grow past 25% + 32 MiB and descriptors past +16."""
        best = None
        for s in self.slots():
            for life in s.lives:
                if best is None or len(life["series"]) > len(best[1]["series"]):
                    best = (s, life)
        if best is None or len(best[1]["series"]) < 6:
            print("flatness: no process lived long enough to judge")
            return
        s, life = best
        ser = life["series"]
        ref = ser[len(ser) // 3]
        rss_max = max(x[1] for x in ser[len(ser) // 3:])
        fds_max = max(x[2] for x in ser[len(ser) // 3:])
        print("flatness (%s pid %d, %d samples over %.0f s): RSS %d KiB at 1/3, max after %d "
              "KiB; fds %d at 1/3, max after %d"
              % (s.name, life["pid"], len(ser), ser[-1][0] - ser[0][0], ref[1], rss_max,
                 ref[2], fds_max))
        if self.asan:
            print("flatness: RSS not judged under ASan (its quarantine of freed memory, 256 MiB "
                  "by default, fills first); descriptors are")
        elif rss_max > ref[1] * 1.25 + 32 * 1024:
            self.stats.fail("RSS of %s pid %d grew: %d -> %d KiB" % (s.name, life["pid"], ref[1],
                                                                    rss_max))
        if fds_max > ref[2] + 16:
            self.stats.fail("descriptors of %s pid %d grew: %d -> %d" % (s.name, life["pid"],
                                                                        ref[2], fds_max))


def _interrupt(*_):
    raise KeyboardInterrupt()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1800, help="seconds (default 1800)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bin", help="kvrouterd binary (default $KVR_BIN or build/kvrouterd)")
    ap.add_argument("--engines", type=int, default=6)
    ap.add_argument("--dp-engines", type=int, default=2, help="engines with 2 DP ranks")
    ap.add_argument("--num-blocks", type=int, default=16384, help="prefix cache per rank")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--speed", type=float, default=2.0, help="trace time speed-up")
    ap.add_argument("--max-hash-ids", type=int, default=24, help="prompt cut (x512 tokens)")
    ap.add_argument("--drop-rate", type=float, default=0.02, help="live batches dropped")
    ap.add_argument("--kill-every", type=float, default=180, help="s between SIGKILLs (+-30%%)")
    ap.add_argument("--max-down", type=float, default=5.0, help="s a killed daemon stays down")
    ap.add_argument("--bootstrap-at", type=float, default=0.1,
                    help="fraction of the run at which replica B bootstraps from A")
    ap.add_argument("--snapshot-interval", type=float, default=2.0)
    ap.add_argument("--settle-every", type=float, default=60)
    ap.add_argument("--settle-timeout", type=float, default=30)
    ap.add_argument("--settle-prompts", type=int, default=40)
    ap.add_argument("--fault-every", type=float, default=8.0, help="max s between faults")
    ap.add_argument("--checkers", type=int, default=2)
    ap.add_argument("--routers", type=int, default=1)
    ap.add_argument("--check-sleep", type=float, default=0.05)
    ap.add_argument("--route-sleep", type=float, default=0.05)
    ap.add_argument("--text-sleep", type=float, default=0.2)
    ap.add_argument("--tokref", help="reference tokenizers dir (default build/tokref)")
    ap.add_argument("--no-text", action="store_true", help="no tokenizer, no text traffic")
    ap.add_argument("--lose-removals", type=float, default=0.0,
                    help="self-test: share of requests whose BlockRemoved events are left out "
                         "of the batch (the run must then fail with mismatches)")
    ap.add_argument("--workdir", default=None, help="parent of the run's temp dir")
    ap.add_argument("--keep", action="store_true", help="keep the workdir when OK")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    if args.bin:
        os.environ["KVR_BIN"] = os.path.abspath(args.bin)
    if not os.path.exists(kvrharness.kvr_bin()):
        sys.exit("no binary at %s: make all" % kvrharness.kvr_bin())
    signal.signal(signal.SIGTERM, _interrupt)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
