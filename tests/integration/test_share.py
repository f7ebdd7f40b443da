"""Replicas sharing their decisions ([route] peer_bind, peers): two real kvrouterd on loopback,
each publishing its /v1/route decisions over ZeroMQ PUB and applying the other's. Covered:
both agree on every worker's in-flight prefill tokens within a few batch intervals; a
decision on one replica moves the other's next choice (the worker just loaded is avoided),
while without sharing each replica piles onto the same worker; a replica that lists itself
among its peers skips its own batches (echoes counted); garbage on the peer socket is
refused and counted, never applied. Loopback only; every wait is bounded.
"""

import time

import pytest

from test_ingest import metric, need_http
from vllm_pub import tokens_for
from kvrharness import free_port

MODEL = "test/share"
PODS = ["127.0.0.1:9501", "127.0.0.1:9502", "127.0.0.1:9503"]


def cfg(bind_port, peer_ports, **route):
    r = {"policy": "ttft", "seed": "7", "prefill_rate": "100",  # flights last ~40 s
         "peer_bind": "tcp://127.0.0.1:%d" % bind_port,
         "peers": " ".join("tcp://127.0.0.1:%d" % p for p in peer_ports)}
    r.update(route)
    return {'model "%s"' % MODEL: {"approximate_pods": ", ".join(PODS), "block_size": "16"},
            "route": r}


def inflight(d):
    """{pod: pending prefill tokens} from /metrics."""
    _, _, body = d.request("GET", "/metrics", admin=True)
    out = {p: 0 for p in PODS}
    for line in body.decode().splitlines():
        if line.startswith("kvrouter_route_inflight_prefill_tokens{"):
            pod = line.split('pod="', 1)[1].split('"', 1)[0]
            out[pod] = float(line.rsplit(" ", 1)[1])
    return out


def route(d, seed, n=64):
    st, res = d.json("POST", "/v1/route", {"model": MODEL, "token_ids": tokens_for(seed, n)})
    assert st == 200, res
    return res["pod"]


def wait_equal(a, b, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ia, ib = inflight(a), inflight(b)
        if ia == ib:
            return ia
        time.sleep(0.005)
    raise AssertionError("in-flight views differ: %r vs %r" % (inflight(a), inflight(b)))


def wait_connected(a, b):
    """PUB/SUB joins late: ping with decisions until the other side applied one."""
    deadline = time.monotonic() + 10
    seed = 10000
    while time.monotonic() < deadline:
        route(a, seed)
        seed += 1
        time.sleep(0.05)
        if (metric(b, "share_decisions_applied_total") or 0) > 0:
            return
    raise AssertionError("no decision of one replica reached the other")


@pytest.fixture
def pair(daemon_factory):
    pa, pb = free_port(), free_port()
    a = daemon_factory(cfg(pa, [pb, pa]))  # a lists itself too: its echoes are skipped
    b = daemon_factory(cfg(pb, [pa]))
    need_http(a)
    need_http(b)
    wait_connected(a, b)
    wait_connected(b, a)
    return a, b


def test_replicas_agree_on_inflight(pair):
    a, b = pair
    base = wait_equal(a, b)
    for i in range(12):
        route(a if i % 2 else b, i, n=64 + 16 * i)
    view = wait_equal(a, b)  # within a few 1 ms batch intervals
    assert sum(view.values()) > sum(base.values())
    assert (metric(a, "share_echoes_total") or 0) > 0  # its own batches came back, skipped
    assert metric(b, "share_echoes_total") == 0
    assert metric(a, "share_malformed_total") == 0


def test_a_peer_decision_moves_the_next_choice(pair):
    """a loads one worker with a long prompt; b, asked right after, goes elsewhere."""
    a, b = pair
    for i in range(6):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        before = inflight(second)
        x = route(first, 100 + i, n=2048)
        deadline = time.monotonic() + 5
        while inflight(second)[x] <= before[x] and time.monotonic() < deadline:
            time.sleep(0.002)
        assert inflight(second)[x] > before[x]
        y = route(second, 200 + i, n=2048)
        assert y != x, (i, x, y, inflight(second))


def test_without_sharing_replicas_pile_up(daemon_factory):
    """The same sequence without peers: each replica's view misses the other's decisions,
    so both send the next long prompt to the worker they each think idle (the same one)."""
    a = daemon_factory(cfg(free_port(), [], peers=""))
    b = daemon_factory(cfg(free_port(), [], peers=""))
    need_http(a)
    need_http(b)
    same = 0
    for i in range(3):
        same += route(a, 100 + i, n=2048) == route(b, 200 + i, n=2048)
    assert same == 3


def test_garbage_is_refused(daemon_factory):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        d = daemon_factory(cfg(free_port(), [port]))
        need_http(d)
        deadline = time.monotonic() + 10
        while (metric(d, "share_malformed_total") or 0) < 1 and time.monotonic() < deadline:
            pub.send(b"KVRS" + b"\x01" * 40)  # right magic, wrong version and lengths
            time.sleep(0.05)
        assert metric(d, "share_malformed_total") >= 1
        assert metric(d, "share_decisions_applied_total") == 0
        assert "share: a peer's batch refused" in d.stderr_text()
    finally:
        pub.close(0)
