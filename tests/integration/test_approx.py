"""Approximate mode end to end: engines that publish no KV events ([model] approximate,
approximate_pods). A routing decision to such a worker makes the daemon assume the worker
holds the request's blocks (tier "assumed"), so the next request sharing that prefix goes
there; assumptions are capped per worker, expire after [route] assumed_ttl, are dropped when
the worker's pod is deleted, and give way to real events the moment the worker publishes.

What the daemon should answer is derived here from the requests sent (which pod got which
prefix), never read back from the daemon.
"""

import time

import pytest

from kvrharness import render_config
from test_ingest import metric, need_http, wait_pod, warm
from vllm_pub import Engine, tokens_for

MODEL = "test/approx"
BS = 16
PODS = ("eng-a", "eng-b", "eng-c")


def cfg(**route):
    r = {"policy": "cost", "seed": "11"}
    r.update(route)
    return {"route": r,
            'model "%s"' % MODEL: {"approximate": "on", "approximate_pods": ", ".join(PODS),
                                   "block_size": str(BS)}}


def route(d, body, status=200):
    st, res = d.json("POST", "/v1/route", body)
    assert st == status, res
    return res


def score_of(d, toks, pod):
    st, res = d.json("POST", "/v1/score", {"model": MODEL, "token_ids": toks})
    assert st == 200, res
    assert res["block_size"] == BS
    for e in res["scores"]:
        if e["pod"] == pod:
            return e
    return None


def wait_matched(d, toks, pod, want, timeout=10):
    """The writer applies assumptions asynchronously: wait until pod matches `want` blocks."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = score_of(d, toks, pod)
        got = last["matched_blocks"] if last else 0
        if got == want:
            return last
        time.sleep(0.02)
    raise AssertionError("pod %s never matched %d blocks; last %r" % (pod, want, last))


def wait_metric(d, name, labels, want, timeout=10):
    """Counters move on the writer thread just after the index changes: poll."""
    deadline = time.monotonic() + timeout
    while True:
        got = metric(d, name, labels)
        if got == want:
            return
        assert time.monotonic() < deadline, (name, labels, got, want)
        time.sleep(0.02)


@pytest.fixture
def approx(daemon_factory):
    d = daemon_factory(cfg())
    need_http(d)
    return d


def test_follow_ups_land_where_the_prefix_was_routed(approx):
    d = approx
    owners = {}
    for i in range(6):  # six conversations, first turns: no candidates sent
        toks = tokens_for(500 + i, 12 * BS + 3)
        res = route(d, {"model": MODEL, "token_ids": toks})
        assert {c["pod"] for c in res["candidates"]} == set(PODS), res
        assert res["assumed"] is True and res["matched_blocks"] == 0, res
        owners[i] = (res["pod"], toks)
        e = wait_matched(d, toks, res["pod"], 12)
        assert e["tiers"] == {"assumed": 12}, e
        assert abs(e["score"] - 12 * 0.7) < 1e-9, e  # [score] weight.assumed default
    assert len({p for p, _ in owners.values()}) > 1  # ties are broken at random, not all on one
    for i, (pod, toks) in owners.items():  # second turns extend the first
        nxt = toks + tokens_for(900 + i, 7 * BS)
        res = route(d, {"model": MODEL, "token_ids": nxt})
        assert res["pod"] == pod and res["matched_blocks"] == 12, (i, res)
        wait_matched(d, nxt, pod, (len(nxt)) // BS)
    wait_metric(d, "route_assumptions_total", 'result="applied"', 12)
    wait_metric(d, "route_assumed_blocks", None, 6 * (12 + 7))
    # /v1/pods lists the workers known only through assumptions, with their blocks
    per_pod = {}
    for pod, _ in owners.values():
        per_pod[pod] = per_pod.get(pod, 0) + 12 + 7
    st, res = d.json("GET", "/v1/pods", admin=True)
    assert st == 200 and res["pods"] == [], res
    assert {(a["pod"], a["dp_rank"]): a["blocks"] for a in res["assumed"]} == \
        {(p, 0): n for p, n in per_pod.items()}, res


def test_gateway_candidates_and_ranks(approx):
    """Candidates a gateway sends (pods not in approximate_pods, other ranks) are assumed too
    when the model is approximate."""
    d = approx
    toks = tokens_for(42, 10 * BS)
    cands = [{"pod": "gw-1", "dp_rank": 1}, {"pod": "gw-2"}]
    res = route(d, {"model": MODEL, "token_ids": toks, "candidates": cands})
    pod, rank = res["pod"], res["dp_rank"]
    assert res["assumed"] is True
    deadline = time.monotonic() + 10
    while True:
        e = score_of(d, toks, pod)
        if e and e["dp_rank"] == rank and e["matched_blocks"] == 10:
            break
        assert time.monotonic() < deadline, e
        time.sleep(0.02)
    res = route(d, {"model": MODEL, "token_ids": toks, "candidates": cands})
    assert (res["pod"], res["dp_rank"], res["matched_blocks"]) == (pod, rank, 10), res


def test_cap_and_expiry(daemon_factory):
    d = daemon_factory(cfg(assumed_max_blocks="8", assumed_ttl="2s"))
    need_http(d)
    toks = tokens_for(7, 20 * BS)
    pod = route(d, {"model": MODEL, "token_ids": toks})["pod"]
    wait_matched(d, toks, pod, 8)  # only the first 8 blocks fit the cap
    other = tokens_for(8, 5 * BS)
    res = route(d, {"model": MODEL, "token_ids": other, "candidates": [{"pod": pod}]})
    assert res["pod"] == pod
    # 5 new blocks: the worker's least recently routed ones (the leaves of the first prompt)
    # make room, its head stays
    wait_matched(d, other, pod, 5)
    wait_matched(d, toks, pod, 3)
    wait_metric(d, "route_assumed_blocks_total", 'event="evicted"', 5)
    # nothing routed for > 2 s: everything expires
    wait_matched(d, toks, pod, 0, timeout=10)
    wait_matched(d, other, pod, 0, timeout=10)
    wait_metric(d, "route_assumed_blocks", None, 0)
    wait_metric(d, "route_assumed_blocks_total", 'event="expired"', 8)
    # a pod known only through assumptions is forgotten with its last one (ids reused)
    wait_metric(d, "route_assumed_pods_forgotten_total", None, 1)
    st, res = d.json("GET", "/v1/pods", admin=True)
    assert st == 200 and res["assumed"] == [], res


def test_events_take_precedence(approx):
    d = approx
    toks = tokens_for(1, 10 * BS)
    res = route(d, {"model": MODEL, "token_ids": toks, "candidates": [{"pod": "eng-a"}]})
    assert res["assumed"] is True
    wait_matched(d, toks, "eng-a", 10)
    # eng-a turns its events on: its first batch drops the assumptions, its events rule
    with Engine(pod="eng-a", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS, num_blocks=256) as e:
        warm(e, d, "eng-a")
        wait_matched(d, toks, "eng-a", 0)
        wait_metric(d, "route_assumed_blocks_total", 'event="dropped"', 10)
        real = tokens_for(2, 6 * BS)
        r = e.rank(0)
        r.request(real)
        wait_pod(d, "eng-a", seq=r.publish())
        # routing to it again assumes nothing: only what it published counts
        route(d, {"model": MODEL, "token_ids": toks, "candidates": [{"pod": "eng-a"}]})
        wait_metric(d, "route_assumptions_total", 'result="events"', 1)
        assert score_of(d, toks, "eng-a") is None
        assert score_of(d, real, "eng-a")["tiers"] == {"gpu": 6}
        # without candidates: eng-a is a candidate once (by its events), chosen for what it
        # holds, and not handed to approximate mode at all
        res = route(d, {"model": MODEL, "token_ids": real})
        assert sorted(c["pod"] for c in res["candidates"]) == sorted(PODS), res
        assert res["pod"] == "eng-a" and res["matched_blocks"] == 6, res
        assert "assumed" not in res, res


def test_delete_pod_and_reload(approx):
    d = approx
    toks = tokens_for(3, 4 * BS)
    pod = route(d, {"model": MODEL, "token_ids": toks})["pod"]
    wait_matched(d, toks, pod, 4)
    st, res = d.json("DELETE", "/v1/pods/" + pod, admin=True)
    assert st == 200, res
    assert score_of(d, toks, pod) is None
    wait_metric(d, "route_assumed_blocks", None, 0)
    # [route] assumed_max_blocks reloads: the next decision assumes 2 blocks, not 4
    with open(d.conf_path, "w") as f:
        f.write(render_config(d.config | {"route": {"policy": "cost", "seed": "11",
                                                    "assumed_max_blocks": "2"}}))
    assert d.reload().group(1) == "ok"
    pod = route(d, {"model": MODEL, "token_ids": toks})["pod"]
    wait_matched(d, toks, pod, 2)
    # approximate off and no pods listed: decisions are no longer assumed, and without events
    # there is no default candidate
    with open(d.conf_path, "w") as f:
        f.write(render_config(d.config | {'model "%s"' % MODEL: {"block_size": str(BS)}}))
    assert d.reload().group(1) == "ok"
    res = route(d, {"model": MODEL, "token_ids": toks, "candidates": [{"pod": "eng-c"}]})
    assert "assumed" not in res, res
    route(d, {"model": MODEL, "token_ids": toks}, status=503)
