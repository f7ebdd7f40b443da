"""Replay everywhere and replicas: [events] bind_replay, first contact, [events] forward.

The real kvrouterd over loopback ZeroMQ against vllm_pub engines (tests/integration/
vllm_pub.py) whose replay ROUTERs bind where vLLM binds them: rank r on replay_endpoint's
port + r, and whose pod id (topic kv@<pod>@<model>) is their address, 127.0.0.1. Checked
against the engines' true prefix caches (the emulator's BlockPool): a stream's block count
and, for every prompt sent, the matched prefix; replicas against each other with /v1/score.

(a) bind mode + bind_replay, kvrouterd started after the engine published: the first contact
    replays from seq 0 and the index is the engine's cache; kill -9, more traffic while it is
    down, restart (no snapshot): the same again. And kill -9 or SIGTERM while the engines
    publish, in bind and in connect mode: once traffic pauses, synced and exact.
(b) bind mode, batches lost on the way: the gap is replayed through bind_replay; a batch the
    engine's ROUTER drops inside the first-contact replay is asked for again.
(c) a primary's forward socket feeding a replica (started late: it replays the history
    it missed from the engines through its connect replay= template): identical answers.
(d) connect mode (replay=), kvrouterd started after the engine published: first contact
    replays from seq 0.
Every wait is bounded.
"""

import random
import signal
import socket
import time

import pytest

import test_ingest
from kvrharness import run_kvr
from test_ingest import metric, need_http, pod_entry
from vllm_pub import Engine, tokens_for

MODEL = "test/replicas"
BS = 16
WAIT = 15.0
POD = "127.0.0.1"  # the pod id is the engine's address: what {pod} is filled with


def free_ports(n):
    """A base port with n consecutive free loopback ports (vLLM offsets by DP rank)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(20000, 60000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d consecutive free ports" % n)


def wait_pod(d, pod, rank=0, seq=None, state=None, timeout=WAIT):
    return test_ingest.wait_pod(d, pod, rank, seq=seq, state=state, timeout=timeout)


def score(d, tokens):
    return test_ingest.score(d, tokens, model=MODEL)


def matched(d, tokens, pod, rank):
    for s in score(d, tokens)["scores"]:
        if s["pod"] == pod and s["dp_rank"] == rank:
            return s["matched_blocks"]
    return 0


def wait_metric(d, name, want, timeout=WAIT):
    deadline = time.monotonic() + timeout
    v = None
    while time.monotonic() < deadline:
        v = metric(d, name)
        if v is not None and v >= want:
            return v
        time.sleep(0.02)
    raise AssertionError("%s = %s, want >= %s" % (name, v, want))


def true_matched(r, tokens):
    """The engine's own answer: leading full blocks of tokens it holds in its cache."""
    n = 0
    for h in r.chain(tokens):
        if r.cache.lookup(h) is None:
            break
        n += 1
    return n


class Traffic:
    """Requests sharing a long-lived system prompt (the case of issue 13), spread over the
    ranks of an engine whose small pool evicts; every prompt sent is remembered."""

    def __init__(self, eng, seed):
        self.eng = eng
        self.rng = random.Random(seed)
        self.system = tokens_for(seed, 4 * BS)
        self.prompts = []

    def step(self, n=1, drop=None):
        """n requests per rank, one batch each; returns {rank: last seq}."""
        last = {}
        for _ in range(n):
            for r in self.eng.ranks:
                tail = tokens_for(self.rng.randrange(1 << 30), self.rng.randint(1, 5) * BS + 3)
                p = self.system + tail
                self.prompts.append(p)
                r.request(p)
                last[r.rank] = r.publish(drop=bool(drop and drop(r, r.seq)))
        return last


def step_until_seen(d, eng, traffic, pod=POD, timeout=WAIT):
    """Traffic until every rank's stream is known to d (after a restart the engine's XPUB may
    not report the new subscriber: its old pipe can still hold the subscription)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = traffic.step(1)
        time.sleep(0.05)
        if all(pod_entry(d, pod, r.rank) is not None for r in eng.ranks):
            return last
    raise AssertionError("streams of %s never seen; stderr tail:\n%s"
                         % (pod, d.stderr_text()[-3000:]))


def assert_index_is_cache(d, eng, traffic, pod=POD):
    for r in eng.ranks:
        p = pod_entry(d, pod, r.rank)
        assert p is not None
        assert p["blocks"] == len(r.cache.cached), (r.rank, p)
        for pr in traffic.prompts:
            assert matched(d, pr, pod, r.rank) == true_matched(r, pr)
        assert matched(d, traffic.system, pod, r.rank) == true_matched(r, traffic.system)


def bind_config(sub_port, replay_port, dp, extra=None):
    ev = {"bind": ["tcp://127.0.0.1:%d" % (sub_port + i) for i in range(dp)],
          "bind_replay": "tcp://{pod}:{%d+rank}" % replay_port,
          "pod_must_match_peer": "on"}
    ev.update(extra or {})
    return {"events": ev}


# ---- (a) bind mode + bind_replay: first contact, and again after kill -9 -------------------

def test_bind_replay_first_contact_and_kill9(daemon_factory):
    dp = 2
    sub, rep = free_ports(dp), free_ports(dp)
    cfg = bind_config(sub, rep, dp)
    with Engine(pod=POD, model=MODEL, mode="connect", endpoints=["tcp://127.0.0.1:%d" % sub],
                dp_size=dp, replay=True, replay_bind="tcp://127.0.0.1:%d" % rep,
                block_size=BS, num_blocks=48) as eng:
        t = Traffic(eng, 1)
        t.step(30)  # published before any kvrouterd listens: lost on the live socket
        d = daemon_factory(cfg, check_exit=False)
        need_http(d)
        eng.wait_subscriber()
        last = t.step(1)  # the first batch it sees has seq 30: replay from 0
        for r in eng.ranks:
            p = wait_pod(d, POD, r.rank, seq=last[r.rank], state="synced")
            assert p["replays"] >= 1 and p["restarts"] == 0, p
            assert r.replay_requests >= 1
        assert_index_is_cache(d, eng, t)
        assert metric(d, "events_blocks_duplicate_total") == 0

        # kill -9; the engines go on; a new process (nothing saved) starts from nothing
        d.signal(signal.SIGKILL)
        d.proc.wait(timeout=10)
        t.step(20)
        d2 = daemon_factory(cfg, check_exit=False)
        step_until_seen(d2, eng, t)
        last = t.step(1)
        for r in eng.ranks:
            wait_pod(d2, POD, r.rank, seq=last[r.rank], state="synced")
            assert r.replay_requests >= 2
        assert_index_is_cache(d2, eng, t)
        assert metric(d2, "events_blocks_duplicate_total") == 0


class Background:
    """Traffic.step(1) every few ms on a thread, until stop(): live traffic while a test kills
    and restarts kvrouterd. Only this thread touches the engine until stop() returns."""

    def __init__(self, traffic):
        import threading
        self.traffic = traffic
        self.halt = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        while not self.halt.is_set():
            self.traffic.step(1)
            time.sleep(0.004)

    def stop(self):
        self.halt.set()
        self.th.join(10)
        assert not self.th.is_alive()


@pytest.mark.parametrize("mode", ["bind", "connect"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_restart_during_live_traffic(daemon_factory, mode, sig):
    """kill -9 or SIGTERM while engines publish, a new process (no snapshot) started while
    they still publish: once traffic pauses, every stream is synced and the index is the
    engines' cache, in bind mode (bind_replay) and in connect mode (replay=)."""
    dp = 2 if mode == "bind" else 1
    sub, rep = free_ports(dp), free_ports(dp)
    if mode == "bind":
        eng = Engine(pod=POD, model=MODEL, mode="connect",
                     endpoints=["tcp://127.0.0.1:%d" % sub], dp_size=dp, replay=True,
                     replay_bind="tcp://127.0.0.1:%d" % rep, block_size=BS, num_blocks=48)
        cfg, pod = bind_config(sub, rep, dp), POD
    else:
        eng = Engine(pod="pod-l", model=MODEL, mode="bind", replay=True, block_size=BS,
                     num_blocks=48)
        r0 = eng.rank(0)
        cfg = {"events": {"bind": None, "connect": "%s replay=%s" % (r0.pub_endpoint,
                                                                    r0.replay_endpoint)}}
        pod = "pod-l"
    with eng:
        t = Traffic(eng, 8)
        d = daemon_factory(cfg, check_exit=False)
        need_http(d)
        bg = Background(t)
        try:
            step_deadline = time.monotonic() + WAIT
            while any(pod_entry(d, pod, r.rank) is None for r in eng.ranks):
                assert time.monotonic() < step_deadline, d.stderr_text()[-3000:]
                time.sleep(0.02)
            time.sleep(0.2)
            d.signal(sig)
            assert d.proc.wait(timeout=10) == (0 if sig == signal.SIGTERM else -sig)
            time.sleep(0.2)  # batches published while no kvrouterd runs
            d2 = daemon_factory(cfg, check_exit=False)
            time.sleep(0.3)  # and while it starts and catches up
        finally:
            bg.stop()
        last = t.step(1)
        for r in eng.ranks:
            p = wait_pod(d2, pod, r.rank, seq=last[r.rank], state="synced")
            assert p["restarts"] == 0, p
        assert_index_is_cache(d2, eng, t, pod=pod)
        assert metric(d2, "events_blocks_duplicate_total") == 0


# ---- (b) bind mode: a gap refilled through bind_replay -------------------------------------

def test_bind_replay_gap(daemon_factory):
    sub, rep = free_ports(1), free_ports(1)
    d = daemon_factory(bind_config(sub, rep, 1))
    need_http(d)
    with Engine(pod=POD, model=MODEL, mode="connect", endpoints=["tcp://127.0.0.1:%d" % sub],
                replay=True, replay_bind="tcp://127.0.0.1:%d" % rep, block_size=BS,
                num_blocks=48) as eng:
        eng.wait_subscriber()
        t = Traffic(eng, 2)
        last = t.step(1)
        wait_pod(d, POD, 0, seq=last[0])
        lost = {last[0] + 2, last[0] + 3, last[0] + 7}
        last = t.step(12, drop=lambda r, seq: seq in lost)
        p = wait_pod(d, POD, 0, seq=last[0], state="synced")
        assert p["gaps"] >= 1 and p["replays"] >= 1, p
        assert eng.rank(0).replay_requests >= 1
        assert_index_is_cache(d, eng, t)
        assert metric(d, "events_replays_total", 'result="ok"') >= 1


def test_first_contact_router_drop_replayed_again(daemon_factory):
    """The engine's ROUTER drops a batch in the middle of the first-contact replay (vLLM sends
    a replay as one burst, SNDHWM 1000): the batch is still in its ring, so kvrouterd asks
    again from there and ends synced with the engine's whole cache."""
    import threading
    sub, rep = free_ports(1), free_ports(1)
    with Engine(pod=POD, model=MODEL, mode="connect", endpoints=["tcp://127.0.0.1:%d" % sub],
                replay=True, replay_bind="tcp://127.0.0.1:%d" % rep, block_size=BS,
                num_blocks=48) as eng:
        r = eng.rank(0)
        t = Traffic(eng, 7)
        t.step(20)
        r.skip_replay = {5}  # the first replay loses batch 5 on the way
        gate = threading.Event()
        r.replay_end_gate = gate  # and its end marker waits until the test lets it go
        d = daemon_factory(bind_config(sub, rep, 1))
        need_http(d)
        eng.wait_subscriber()
        last = t.step(1)
        assert r.replay_served.wait(WAIT), "no replay request reached the engine"
        r.skip_replay = set()  # what the ROUTER dropped is still in the ring
        r.replay_end_gate = None
        gate.set()
        p = wait_pod(d, POD, 0, seq=last[0], state="synced")
        assert r.replay_requests >= 2 and p["replays"] >= 2, p
        assert_index_is_cache(d, eng, t)
        assert metric(d, "events_blocks_duplicate_total") == 0


def test_bind_replay_refused_by_check(tmp_path):
    """kvrouterd -t names the line of a bad template."""
    conf = tmp_path / "k.conf"
    conf.write_text("[events]\nbind = tcp://127.0.0.1:0\nbind_replay = tcp://{pod}:{99999+rank}\n")
    res = run_kvr(["-t", "-c", str(conf)])
    assert res.returncode == 1
    assert "%s:3: [events] bind_replay" % conf in res.stderr, res.stderr
    conf.write_text("[events]\nbind = tcp://127.0.0.1:0\nbind_replay = tcp://{pod}:{5558+rank}\n"
                    "forward = tcp://127.0.0.1:0\n")
    res = run_kvr(["-t", "-c", str(conf)])
    assert res.returncode == 0, res.stderr


# ---- (c) forward: a primary feeding a replica ----------------------------------------------

def test_forward_feeds_replica(daemon_factory):
    dp = 2
    sub, rep, fwd = free_ports(dp), free_ports(dp), free_ports(1)
    primary = daemon_factory(bind_config(sub, rep, dp,
                                         {"forward": "tcp://127.0.0.1:%d" % fwd}))
    need_http(primary)
    with Engine(pod=POD, model=MODEL, mode="connect", endpoints=["tcp://127.0.0.1:%d" % sub],
                dp_size=dp, replay=True, replay_bind="tcp://127.0.0.1:%d" % rep,
                block_size=BS, num_blocks=48) as eng:
        eng.wait_subscriber()
        t = Traffic(eng, 3)
        t.step(15)  # the replica is not there yet
        replica = daemon_factory({"events": {
            "bind": None,
            "connect": "tcp://127.0.0.1:%d replay=tcp://{pod}:{%d+rank}" % (fwd, rep)}})
        wait_metric(primary, "events_forward_subscriptions_total", 1)
        time.sleep(0.2)  # the subscription is in place at the XPUB before it reports it
        last = t.step(15)
        for d in (primary, replica):
            for r in eng.ranks:
                wait_pod(d, POD, r.rank, seq=last[r.rank], state="synced")
        assert_index_is_cache(primary, eng, t)
        assert_index_is_cache(replica, eng, t)
        rng = random.Random(4)
        queries = [p[:rng.randint(1, len(p))] for p in rng.sample(t.prompts, 40)]
        queries += [t.system + tokens_for(rng.randrange(1 << 30), 2 * BS) for _ in range(10)]
        for q in queries:
            a, b = score(primary, q), score(replica, q)
            assert a == b, (q, a, b)
        assert metric(primary, "events_forwarded_total") >= 30
        assert metric(primary, "events_forward_dropped_total") == 0
        # the replica's late start was recovered through the engines' ROUTERs
        for r in eng.ranks:
            assert pod_entry(replica, POD, r.rank)["replays"] >= 1


# ---- (d) connect mode: first contact from seq 0 --------------------------------------------

def test_connect_first_contact(daemon_factory):
    with Engine(pod="pod-c", model=MODEL, mode="bind", replay=True, block_size=BS,
                num_blocks=48) as eng:
        r = eng.rank(0)
        t = Traffic(eng, 5)
        t.step(25)  # nobody subscribed yet
        d = daemon_factory({"events": {"bind": None,
                                       "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                    r.replay_endpoint)}})
        need_http(d)
        eng.wait_subscriber()
        last = t.step(1)
        p = wait_pod(d, "pod-c", 0, seq=last[0], state="synced")
        assert p["replays"] >= 1 and p["gaps"] == 0, p
        assert r.replay_requests >= 1
        assert_index_is_cache(d, eng, t, pod="pod-c")


def test_connect_first_contact_ring_lost_seq0(daemon_factory):
    """An engine whose ring no longer holds seq 0: what it holds is applied and the stream
    says unsynced (its oldest blocks may be missing), never synced."""
    with Engine(pod="pod-o", model=MODEL, mode="bind", replay=True, block_size=BS,
                num_blocks=48, buffer_steps=8) as eng:
        r = eng.rank(0)
        t = Traffic(eng, 6)
        t.step(20)
        d = daemon_factory({"events": {"bind": None,
                                       "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                    r.replay_endpoint)}})
        need_http(d)
        eng.wait_subscriber()
        last = t.step(1)
        wait_pod(d, "pod-o", 0, seq=last[0], state="unsynced")
        assert r.replay_requests >= 1
