"""Snapshots, warm restart and peer bootstrap ([state], GET /v1/snapshot) with the real binary.

Simulated engines publish through a bound PUB socket that the daemon dials ([events]
connect), so a restarted daemon reconnects to the same engines. The test keeps each pod's true
cache (the reference model: the set of prefixes it stored, minus those it removed) and checks
every score against it before and after the restart: a restart must change no answer. Every
wait is bounded; timing is never asserted."""

import collections
import glob
import os
import random
import re
import signal
import time

import pytest
import zmq

from kvrharness import run_kvr
from test_http import (BS, MODEL, Pub, block_removed, block_stored, engine_hash, score, stream,
                       sync, toks, wait_seq, zctx)  # noqa: F401 (zctx: a fixture)
from test_ingest import metric

WAIT = 10.0
PODS = ("pod-a", "pod-b", "pod-c")


class XPub(Pub):
    """Pub on a bound XPUB socket (a PUB on the wire) that sees subscriptions, so a test can
    wait until a (re)started daemon is attached instead of losing batches to the slow-joiner
    window."""

    def __init__(self, ctx):
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100000)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = "tcp://127.0.0.1:%d" % port
        self.seq = {}

    def drain(self):
        while self.sock.poll(0):
            self.sock.recv()

    def wait_subscriber(self, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(50) and self.sock.recv()[:1] == b"\x01":
                return
        raise AssertionError("no subscriber attached within %.0f s" % timeout)


class Fleet:
    """Engines (one PUB socket, several pods) and the reference model of their caches."""

    def __init__(self, ctx, seed):
        self.pub = XPub(ctx)
        self.rng = random.Random(seed)
        # pod -> {engine hash of a block: copies}; a store of a block already held adds a
        # copy, a removal drops one (the index refcounts them the same way)
        self.cache = {p: collections.Counter() for p in PODS}
        self.prompts = [toks(100 + i, 6 * BS) for i in range(8)]
        # a shared "system prompt": the first 2 blocks of every prompt
        for p in self.prompts[1:]:
            p[:2 * BS] = self.prompts[0][:2 * BS]

    def held(self, pod, prefix):
        return self.cache[pod][engine_hash(prefix)] > 0

    def store(self, d, pod, prompt, nblocks):
        toks_ = prompt[:nblocks * BS]
        seq = self.pub.send(pod, MODEL, [block_stored(toks_)])
        for end in range(BS, len(toks_) + 1, BS):
            self.cache[pod][engine_hash(toks_[:end])] += 1
        return seq

    def remove_tail(self, pod, prompt, nblocks):
        seq = self.pub.send(pod, MODEL, [block_removed(prompt[:nblocks * BS])])
        self.cache[pod][engine_hash(prompt[:nblocks * BS])] -= 1
        return seq

    def traffic(self, d, n):
        """n random batches (stores of random prompts and lengths, some tail removals);
        waits until the daemon applied the last batch of every pod."""
        last = {}
        for _ in range(n):
            pod = self.rng.choice(PODS)
            prompt = self.rng.choice(self.prompts)
            k = self.rng.randint(1, 6)
            if self.rng.random() < 0.2 and self.held(pod, prompt[:k * BS]):
                # only a block without held children is removed (vLLM frees tails first)
                if not any(self.held(pod, prompt[:j * BS]) for j in range(k + 1, 7)):
                    last[pod] = self.remove_tail(pod, prompt, k)
                    continue
            last[pod] = self.store(d, pod, prompt, k)
        for pod, seq in last.items():
            wait_seq(d, pod, MODEL, seq, timeout=WAIT)

    def expected(self, prompt):
        """{pod: matched blocks} from the reference model."""
        out = {}
        for pod in PODS:
            k = 0
            while k < len(prompt) // BS and self.held(pod, prompt[:(k + 1) * BS]):
                k += 1
            if k > 0:
                out[pod] = k
        return out

    def check(self, d):
        answers = {}
        for i, prompt in enumerate(self.prompts):
            body = score(d, prompt)
            got = {e["pod"]: e["matched_blocks"] for e in body["scores"]}
            assert got == self.expected(prompt), (i, got, self.expected(prompt))
            answers[i] = got
        return answers

    def close(self):
        self.pub.close()


def state_conf(state_dir, pub, interval="0", **extra):
    conf = {"events": {"bind": None, "connect": pub.endpoint},
            "state": {"dir": str(state_dir), "snapshot_interval": interval}}
    for k, v in extra.items():
        conf.setdefault(k, {}).update(v)
    return conf


def start(daemon_factory, conf, fleet):
    """A daemon dialing the fleet's engines, returned once it is attached."""
    fleet.pub.drain()
    d = daemon_factory(conf)
    fleet.pub.wait_subscriber()
    return d


def start_synced(daemon_factory, conf, fleet):
    d = start(daemon_factory, conf, fleet)
    for pod in PODS:
        sync(d, fleet.pub, pod, MODEL)
    return d


def pods_states(d):
    status, body = d.json("GET", "/v1/pods", admin=True)
    assert status == 200, body
    return {(s["pod"], s["dp_rank"]): (s["state"], s["last_seq"]) for s in body["pods"]}


def wait_state(d, pod, state, timeout=WAIT):
    deadline = time.monotonic() + timeout
    s = None
    while time.monotonic() < deadline:
        s = stream(d, pod, MODEL)
        if s is not None and s["state"] == state:
            return s
        time.sleep(0.02)
    raise AssertionError("%s never %s: %r" % (pod, state, s))


def restart_checks(d2, fleet, before, saved_seqs):
    """After a restart: streams restored at their saved seq, the same answers; batches that
    continue at last + 1 make them synced, and answers follow the engines again."""
    states = pods_states(d2)
    for pod in PODS:
        st, last = states[(pod, 0)]
        assert st == "restored", states
        assert last == saved_seqs[pod], (pod, last, saved_seqs)
    assert fleet.check(d2) == before
    fleet.traffic(d2, 30)
    for pod in PODS:
        wait_state(d2, pod, "synced")
    fleet.check(d2)


def test_sigterm_restart(daemon_factory, zctx, tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    fleet = Fleet(zctx, seed)
    try:
        d1 = start_synced(daemon_factory, state_conf(tmp_path, fleet.pub), fleet)
        fleet.traffic(d1, 60)
        before = fleet.check(d1)
        saved = {pod: stream(d1, pod, MODEL)["last_seq"] for pod in PODS}
        assert d1.stop() == 0
        assert "snapshot written" in d1.stderr_text()
        assert os.path.exists(tmp_path / "snapshot.kvr")
        assert not os.path.exists(tmp_path / "snapshot.tmp")

        d2 = start(daemon_factory, state_conf(tmp_path, fleet.pub), fleet)
        assert "snapshot loaded from" in d2.stderr_text()
        # recovery: a line at the start of the load, its results in /metrics
        assert re.search(r"recovery: loading the snapshot from \S+ \(\d+ workers, \d+ pairs",
                         d2.stderr_text())
        assert metric(d2, "recovery_snapshot_info", 'source="file"') == 1
        assert metric(d2, "recovery_snapshot_streams_restored") == len(PODS)
        assert metric(d2, "recovery_snapshot_pairs_restored") == metric(d2, "index_holders") > 0
        assert metric(d2, "recovery_bootstrap_seconds") == 0
        restart_checks(d2, fleet, before, saved)
    finally:
        fleet.close()


def test_kill9_restart_with_periodic_snapshots(daemon_factory, zctx, tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    fleet = Fleet(zctx, seed)
    try:
        d1 = start_synced(daemon_factory, state_conf(tmp_path, fleet.pub, interval="100ms"),
                          fleet)
        fleet.traffic(d1, 60)
        before = fleet.check(d1)
        saved = {pod: stream(d1, pod, MODEL)["last_seq"] for pod in PODS}
        # a snapshot that began after the last batch was applied: two more complete ones
        n0 = metric(d1, "snapshot_total")
        deadline = time.monotonic() + WAIT
        while metric(d1, "snapshot_total") < n0 + 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(d1, "snapshot_total") >= n0 + 2
        assert metric(d1, "snapshot_failures_total") == 0
        assert metric(d1, "snapshot_bytes") > 0
        d1.signal(signal.SIGKILL)
        d1.proc.wait(timeout=WAIT)
        d1.exit_code = -9

        d2 = start(daemon_factory, state_conf(tmp_path, fleet.pub, interval="100ms"), fleet)
        restart_checks(d2, fleet, before, saved)
    finally:
        fleet.close()


def test_restart_gap_and_engine_restart(daemon_factory, zctx, tmp_path):
    """Without replay: a stream whose next batch skips seqs is unsynced; one whose seq went
    back (the engine restarted while the daemon was down) is purged and synced."""
    fleet = Fleet(zctx, 7)
    try:
        d1 = start_synced(daemon_factory, state_conf(tmp_path, fleet.pub), fleet)
        fleet.traffic(d1, 20)
        assert d1.stop() == 0
        d2 = start(daemon_factory, state_conf(tmp_path, fleet.pub), fleet)
        # pod-a: a gap (one batch "lost" while the daemon was down)
        topic = ("kv@%s@%s" % ("pod-a", MODEL)).encode()
        fleet.pub.seq[(topic, 0)] += 1
        seq = fleet.store(d2, "pod-a", fleet.prompts[0], 1)
        wait_seq(d2, "pod-a", MODEL, seq)
        assert wait_state(d2, "pod-a", "unsynced")["gaps"] >= 1
        # pod-b: the engine restarted (seq 0 again, empty cache)
        fleet.cache["pod-b"] = collections.Counter()
        topic = ("kv@%s@%s" % ("pod-b", MODEL)).encode()
        fleet.pub.seq[(topic, 0)] = -1
        seq = fleet.store(d2, "pod-b", fleet.prompts[3], 2)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            s = stream(d2, "pod-b", MODEL)
            assert s is not None, (pods_states(d2), d2.stderr_text()[-3000:])
            if s["state"] == "synced" and s["last_seq"] == 0 and s["restarts"] == 1:
                break
            time.sleep(0.02)
        s = stream(d2, "pod-b", MODEL)
        assert (s["state"], s["last_seq"], s["restarts"]) == ("synced", 0, 1), s
        got = {e["pod"]: e["matched_blocks"] for e in score(d2, fleet.prompts[3])["scores"]}
        assert got.get("pod-b") == fleet.expected(fleet.prompts[3]).get("pod-b") == 2
    finally:
        fleet.close()


def test_peer_bootstrap(daemon_factory, zctx, tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    fleet = Fleet(zctx, seed)
    try:
        token = "s3cret"
        os.makedirs(tmp_path / "a")
        d1 = start_synced(daemon_factory,
                          state_conf(tmp_path / "a", fleet.pub, http={"admin_token": token}),
                          fleet)
        fleet.traffic(d1, 60)
        before = fleet.check(d1)
        saved = {pod: stream(d1, pod, MODEL)["last_seq"] for pod in PODS}

        # the route: admin listener only, bearer token as for mutations
        status, _, _ = d1.request("GET", "/v1/snapshot")
        assert status == 404
        status, _, _ = d1.request("GET", "/v1/snapshot", admin=True)
        assert status == 401
        status, hdrs, body = d1.request("GET", "/v1/snapshot", admin=True,
                                        headers={"Authorization": "Bearer " + token})
        assert status == 200 and body[:8] == b"KVRSNAP\0"
        assert hdrs["content-type"] == "application/octet-stream"
        assert int(hdrs["content-length"]) == len(body)

        os.makedirs(tmp_path / "b")
        conf = state_conf(tmp_path / "b", fleet.pub, http={"admin_token": token})
        conf["state"]["bootstrap"] = "http://127.0.0.1:%d" % d1.admin_port
        d2 = start(daemon_factory, conf, fleet)
        assert "snapshot loaded from http://" in d2.stderr_text()
        assert re.search(r"recovery: bootstrap: \d+ bytes from http://\S+ in [0-9.]+ s",
                         d2.stderr_text())
        assert metric(d2, "recovery_snapshot_info", 'source="peer"') == 1
        assert metric(d2, "recovery_bootstrap_bytes") > 0
        assert metric(d2, "recovery_bootstrap_failed") == 0
        assert os.path.exists(tmp_path / "b" / "snapshot.kvr")  # saved locally
        restart_checks(d2, fleet, before, saved)
        assert fleet.check(d1) == fleet.check(d2)
    finally:
        fleet.close()


def test_bootstrap_peer_down_starts_empty(daemon_factory, tmp_path):
    conf = {"state": {"dir": str(tmp_path), "bootstrap": "http://127.0.0.1:9"}}
    d = daemon_factory(conf)
    assert "bootstrap from http://127.0.0.1:9 failed" in d.stderr_text()
    assert pods_states(d) == {}
    assert metric(d, "recovery_bootstrap_failed") == 1
    assert metric(d, "recovery_snapshot_info", 'source="none"') == 1


def corrupt_cases(good):
    cases = {"truncated": good[:len(good) // 2], "flipped": bytearray(good),
             "foreign": b"PK\x03\x04" + good[4:], "empty": b""}
    cases["flipped"][len(good) // 3] ^= 0x40
    future = bytearray(good)
    future[8] = 99  # version 99
    cases["future"] = future
    return cases


def test_corrupt_snapshot_is_set_aside(daemon_factory, zctx, tmp_path):
    fleet = Fleet(zctx, 3)
    try:
        src = tmp_path / "src"
        os.makedirs(src)
        d1 = start_synced(daemon_factory, state_conf(src, fleet.pub), fleet)
        fleet.traffic(d1, 10)
        assert d1.stop() == 0
        good = (src / "snapshot.kvr").read_bytes()
        for name, data in corrupt_cases(good).items():
            sd = tmp_path / name
            os.makedirs(sd)
            (sd / "snapshot.kvr").write_bytes(bytes(data))
            d = daemon_factory({"state": {"dir": str(sd)}})
            lines = [ln for ln in d.stderr_text().splitlines() if "refused" in ln]
            assert len(lines) == 1, (name, lines)
            if name == "future":
                assert "newer than this kvrouterd" in lines[0]
            aside = glob.glob(str(sd / "snapshot.kvr.bad-*"))
            assert len(aside) == 1, (name, os.listdir(sd))
            assert open(aside[0], "rb").read() == bytes(data)  # kept as it was
            assert pods_states(d) == {}
            assert metric(d, "index_holders") == 0
            d.stop()
    finally:
        fleet.close()


def test_unusable_state_dir(daemon_factory, tmp_path):
    # missing with its parent: an error (a missing dir whose parent exists is created at
    # startup: test_lifecycle.py test_missing_state_dir_is_created_at_start)
    missing = tmp_path / "nope" / "state"
    conf_path = tmp_path / "k.conf"
    conf_path.write_text("[events]\nbind = tcp://127.0.0.1:*\n[state]\ndir = %s\n" % missing)
    r = run_kvr(["-t", "-c", str(conf_path)])
    assert r.returncode == 1
    assert "[state] dir" in r.stderr and str(missing) in r.stderr
    os.makedirs(missing)
    r = run_kvr(["-t", "-c", str(conf_path)])
    assert r.returncode == 0, r.stderr
    if os.geteuid() != 0:  # root writes anywhere
        os.chmod(missing, 0o500)
        r = run_kvr(["-t", "-c", str(conf_path)])
        assert r.returncode == 1 and "not writable" in r.stderr
        os.chmod(missing, 0o700)


def test_startup_fails_on_missing_state_dir(tmp_path):
    missing = tmp_path / "gone" / "state"  # its parent missing too: nothing is created
    conf_path = tmp_path / "k.conf"
    conf_path.write_text("[events]\nbind = tcp://127.0.0.1:*\n[http]\nlisten = 127.0.0.1:0\n"
                         "[state]\ndir = %s\n" % missing)
    r = run_kvr(["-c", str(conf_path)], timeout=20)
    assert r.returncode == 1, r.stderr
    assert "startup failed: state directory %s" % missing in r.stderr, r.stderr


# ---- restart with replay: simulated vLLM engines sharing a system prompt ------------------

def engine_expected(eng, tokens):
    """Blocks of tokens the engine's prefix cache holds from the start (its true cache)."""
    r = eng.rank(0)
    k = 0
    for h in r.chain(tokens):
        if r.cache.lookup(h) is None:
            break
        k += 1
    return k


def check_engines(d, engines, prompts):
    for p in prompts:
        got = {e["pod"]: e["matched_blocks"] for e in score(d, p, model=VMODEL)["scores"]}
        want = {eng.pod: engine_expected(eng, p) for eng in engines}
        want = {k: v for k, v in want.items() if v > 0}
        assert got == want, (got, want)


VMODEL = "test/llama"


@pytest.mark.parametrize("mode", ["connect", "bind"])
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_catches_up_through_replay(daemon_factory, tmp_path, how, mode):
    """The issue's case: requests share a system prompt the engines keep cached and never
    announce again. After a restart (SIGTERM, or kill -9 with periodic snapshots) and batches
    published while the daemon was down, the engines' next batches reveal the gap, the
    daemon replays from last + 1 and every score equals the engines' true caches. In both
    modes: the daemon dials the engines (connect, replay= per engine), or the engines dial
    the daemon's bind socket and their replay ROUTERs are found through [events]
    bind_replay (pod id = the engine's address, 127.0.0.X, ROUTER on a common port)."""
    from vllm_pub import Engine, tokens_for
    from test_replicas import free_ports
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    system = tokens_for(seed, 4 * BS)
    if mode == "connect":
        engines = [Engine(pod="10.0.0.%d" % (i + 1), model=VMODEL, mode="bind", replay=True,
                          block_size=BS, num_blocks=512) for i in range(3)]
    else:
        sub, rep = free_ports(1), free_ports(1)
        engines = [Engine(pod="127.0.0.%d" % (i + 1), model=VMODEL, mode="connect",
                          endpoints=["tcp://127.0.0.1:%d" % sub], replay=True,
                          replay_bind="tcp://127.0.0.%d:%d" % (i + 1, rep),
                          block_size=BS, num_blocks=512) for i in range(3)]

    def run_requests(n, drop=False):
        prompts = []
        for _ in range(n):
            eng = rng.choice(engines)
            p = system + tokens_for(rng.randrange(1 << 30), rng.randint(1, 6) * BS)
            eng.rank(0).request(p)
            eng.rank(0).publish(drop=drop)
            prompts.append(p)
        return prompts

    def conf(interval):
        if mode == "connect":
            ev = {"bind": None,
                  "connect": ["%s replay=%s" % (e.rank(0).pub_endpoint,
                                                e.rank(0).replay_endpoint) for e in engines]}
        else:
            ev = {"bind": ["tcp://127.0.0.1:%d" % sub],
                  "bind_replay": "tcp://{pod}:{%d+rank}" % rep}
        return {"events": ev, "state": {"dir": str(tmp_path), "snapshot_interval": interval}}

    def wait_all(d, state=None):
        for e in engines:
            deadline = time.monotonic() + WAIT
            s = None
            while time.monotonic() < deadline:
                s = stream(d, e.pod, VMODEL)
                if s is not None and s["last_seq"] == e.rank(0).seq - 1 and \
                        (state is None or s["state"] == state):
                    break
                time.sleep(0.02)
            assert s is not None and s["last_seq"] == e.rank(0).seq - 1, (e.pod, s)
            assert state is None or s["state"] == state, (e.pod, s)

    interval = "100ms" if how == "kill9" else "0"
    try:
        d1 = daemon_factory(conf(interval))
        for e in engines:
            e.wait_subscriber()
            e.rank(0).publish()  # the baseline
        wait_all(d1)
        prompts = run_requests(60)
        wait_all(d1, "synced")
        check_engines(d1, engines, prompts[-20:] + [system])
        if how == "sigterm":
            assert d1.stop() == 0
        else:
            n0 = metric(d1, "snapshot_total")
            deadline = time.monotonic() + WAIT
            while metric(d1, "snapshot_total") < n0 + 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            d1.signal(signal.SIGKILL)
            d1.proc.wait(timeout=WAIT)
            d1.exit_code = -9
        # the engines go on while the daemon is down: these batches are only in their rings
        # (dropped on the live socket: an engine's PUB that dials the daemon, bind mode, would
        # otherwise queue them in its pipe and deliver them after the reconnection)
        prompts += run_requests(30, drop=True)

        for e in engines:  # drop what the dead daemon's subscription left queued
            while e.rank(0).pub.poll(0):
                e.rank(0).pub.recv()
        d2 = daemon_factory(conf(interval))
        if mode == "connect":
            for e in engines:
                e.wait_subscriber()
        # (bind mode: an engine's XPUB may not report the new subscriber, its old pipe can
        # still hold the subscription; the batches below are repeated until they arrive)
        states = pods_states(d2)
        assert {st for st, _ in states.values()} == {"restored"}, states
        # a restarted daemon answers from the snapshot at once (the system prompt above all)
        for e in engines:
            assert engine_expected(e, system) == 4
        assert {x["pod"]: x["matched_blocks"]
                for x in score(d2, system, model=VMODEL)["scores"]} == \
            {e.pod: 4 for e in engines}
        prompts += run_requests(9)
        t0 = time.monotonic()
        rounds = 0
        deadline = t0 + WAIT
        while True:  # every engine's next batch (reveals its gap), until each is received
            for e in engines:
                e.rank(0).publish()
            rounds += 1
            time.sleep(0.05)
            if all((stream(d2, e.pod, VMODEL) or {}).get("state") != "restored"
                   for e in engines) or time.monotonic() > deadline:
                break
        wait_all(d2, "synced")
        print("%s restart, %s mode: every stream synced %.3f s after the engines' next batch "
              "(%d round(s) of batches)" % (how, mode, time.monotonic() - t0, rounds))
        check_engines(d2, engines, prompts[-40:] + [system])
        assert metric(d2, "events_replays_total", 'result="ok"') >= len(engines)
        assert metric(d2, "events_blocks_duplicate_total") == 0

        # The restarted daemon saves again (its streams were taken over from restored
        # entries: a shutdown snapshot once failed there with ENOMEM), and a third process
        # comes back where the second stopped, answering as it did.
        assert d2.stop() == 0
        assert "snapshot" not in "".join(
            line for line in d2.stderr_text().splitlines(True) if " error " in line), \
            d2.stderr_text()[-3000:]
        d3 = daemon_factory(conf(interval))
        states = pods_states(d3)
        assert states == {(e.pod, 0): ("restored", e.rank(0).seq - 1) for e in engines}, states
        check_engines(d3, engines, prompts[-40:] + [system])
    finally:
        for e in engines:
            e.close()


def test_bootstrap_refused_or_older(daemon_factory, zctx, tmp_path):
    """A peer that refuses (wrong token): a warning, the daemon starts with what it has. With
    a local snapshot, the peer's is taken when newer: it is taken at the request, so a peer
    that has run all along wins over a file written before a restart."""
    fleet = Fleet(zctx, 11)
    try:
        os.makedirs(tmp_path / "peer")
        peer = start_synced(daemon_factory,
                            state_conf(tmp_path / "peer", fleet.pub,
                                       http={"admin_token": "right"}), fleet)
        fleet.traffic(peer, 10)
        os.makedirs(tmp_path / "b")
        conf = state_conf(tmp_path / "b", fleet.pub, http={"admin_token": "wrong"})
        conf["state"]["bootstrap"] = "http://127.0.0.1:%d" % peer.admin_port
        d = daemon_factory(conf)
        assert re.search(r"bootstrap from \S+ failed: peer answered .HTTP/1.1 403",
                         d.stderr_text()), d.stderr_text()
        assert pods_states(d) == {}
        assert d.stop() == 0  # writes its own (empty) snapshot
        assert os.path.exists(tmp_path / "b" / "snapshot.kvr")
        conf["http"]["admin_token"] = "right"
        d = daemon_factory(conf)
        assert "snapshot loaded from http://" in d.stderr_text()
        assert {k: v[1] for k, v in pods_states(d).items()} == \
            {k: v[1] for k, v in pods_states(peer).items()}
        fleet.check(d)
    finally:
        fleet.close()
