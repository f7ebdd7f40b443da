"""Predicted entries end to end (issue #26): a /v1/route decision to a worker that publishes
events predicts the request's blocks on it ([route] predicted_ttl), so siblings sharing a
prefix routed before the first one's events exist land together; /v1/score keeps
matched_blocks exact and reports predicted_blocks apart; the worker's BlockStored confirms a
prediction, its removal or AllBlocksCleared contradicts it, and the TTL expires it.

Engines publish through the real ZeroMQ path (vllm_pub); what the daemon should answer is
derived here from the requests sent, never read back from the daemon.
"""

import time

import pytest

from test_ingest import metric, need_http, wait_pod, warm
from vllm_pub import Engine, tokens_for

MODEL = "test/predict"
BS = 16
PODS = tuple("w%d" % i for i in range(8))
PREFIX = 40  # blocks shared by the siblings


def cfg(**route):
    # the default policy (ttft); a slow configured prefill rate, so that a slow machine's
    # gaps between the routes never count a queued prefill as done (ties would then be
    # broken at random)
    r = {"seed": "5", "prefill_rate": "1000"}
    r.update(route)
    return {"route": r, 'model "%s"' % MODEL: {"block_size": str(BS)}}


def route(d, toks):
    st, res = d.json("POST", "/v1/route", {"model": MODEL, "token_ids": toks})
    assert st == 200, res
    return res


def score_of(d, toks, pod):
    st, res = d.json("POST", "/v1/score", {"model": MODEL, "token_ids": toks})
    assert st == 200, res
    for e in res["scores"]:
        if e["pod"] == pod:
            return e
    return None


def wait_score(d, toks, pod, matched, predicted, timeout=10):
    """Predictions are applied by the pod's writer thread, after the decision: poll."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = score_of(d, toks, pod)
        got = (last["matched_blocks"], last.get("predicted_blocks")) if last else (0, None)
        if got == (matched, predicted):
            return last
        time.sleep(0.02)
    raise AssertionError("pod %s never scored matched=%d predicted=%s; last %r"
                         % (pod, matched, predicted, last))


def wait_metric(d, name, labels, want, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        got = metric(d, name, labels)
        if got == want:
            return
        assert time.monotonic() < deadline, (name, labels, got, want)
        time.sleep(0.02)


def siblings(n, seed=1):
    prefix = tokens_for(seed, PREFIX * BS)
    return [prefix + tokens_for(seed * 100 + i, 2 * BS) for i in range(n)]


@pytest.fixture
def fleet(request, daemon_factory):
    """A daemon (route settings from the test's parameter) and 8 idle engines with events."""
    d = daemon_factory(cfg(**getattr(request, "param", {})))
    need_http(d)
    d.engines = {}
    try:
        for pod in PODS:
            e = Engine(pod=pod, model=MODEL, mode="connect", endpoints=d.events, block_size=BS,
                       num_blocks=1024)
            e.__enter__()
            d.engines[pod] = e
            warm(e, d, pod)
        yield d
    finally:
        for e in d.engines.values():
            e.__exit__(None, None, None)


def test_siblings_land_together(fleet):
    d = fleet
    sib = siblings(4)
    first = route(d, sib[0])
    pod = first["pod"]
    assert first["matched_blocks"] == 0 and first.get("predicted") is True, first
    # /v1/score: nothing exact anywhere, the chosen worker predicts the whole prompt
    e = wait_score(d, sib[0], pod, 0, PREFIX + 2)
    assert e["tiers"] == {"predicted": PREFIX + 2}, e
    # the siblings, before any event: the shared prefix is predicted on the first's worker
    for toks in sib[1:]:
        res = route(d, toks)
        assert res["pod"] == pod, (pod, res)
        assert res["matched_blocks"] == 0 and res["predicted_blocks"] == PREFIX, res
    wait_metric(d, "route_predictions_total", 'result="applied"', 4)
    # 42 new blocks, then 2 per sibling; the prefix refreshed 3 times
    wait_metric(d, "route_predicted_blocks_total", 'event="stored"', PREFIX + 2 + 3 * 2)
    assert metric(d, "route_predicted_blocks", None) == PREFIX + 2 + 3 * 2


@pytest.mark.parametrize("fleet", [{"predicted_ttl": "0"}], indirect=True)
def test_without_predictions_siblings_spread(fleet):
    d = fleet
    pods = [route(d, toks)["pod"] for toks in siblings(4, seed=2)]
    assert len(set(pods)) > 1, pods
    assert metric(d, "route_predictions_total", 'result="applied"') == 0
    st, res = d.json("POST", "/v1/score", {"model": MODEL, "token_ids": siblings(1, 2)[0]})
    assert st == 200 and res["scores"] == [], res


def test_confirmed_by_the_workers_events(fleet):
    d = fleet
    sib = siblings(2, seed=3)
    pod = route(d, sib[0])["pod"]
    wait_score(d, sib[0], pod, 0, PREFIX + 2)
    assert route(d, sib[1])["pod"] == pod
    wait_score(d, sib[1], pod, 0, PREFIX + 2)
    # the first sibling's prefill completes: its 42 blocks are exact now, their predictions
    # go (the second's 2 suffix blocks stay predicted on top of the exact prefix)
    r = d.engines[pod].rank(0)
    r.request(sib[0])
    wait_pod(d, pod, seq=r.publish())
    wait_score(d, sib[0], pod, PREFIX + 2, None)
    wait_metric(d, "route_predicted_blocks_total", 'event="confirmed"', PREFIX + 2)
    e = wait_score(d, sib[1], pod, PREFIX, PREFIX + 2)
    assert e["tiers"]["gpu"] == PREFIX, e
    # then the second's: nothing predicted is left
    r.request(sib[1])
    wait_pod(d, pod, seq=r.publish())
    wait_score(d, sib[1], pod, PREFIX + 2, None)
    wait_metric(d, "route_predicted_blocks_total", 'event="confirmed"', PREFIX + 4)
    assert metric(d, "route_predicted_blocks", None) == 0
    assert metric(d, "route_predicted_blocks_total", 'event="contradicted"') == 0


def test_contradicted_by_removal_and_clear(fleet):
    d = fleet
    toks = tokens_for(7, 12 * BS)
    # w3 holds the first 6 blocks; the full prompt goes there and predicts the rest
    r = d.engines["w3"].rank(0)
    hashes = r.store(toks[:6 * BS])
    wait_pod(d, "w3", seq=r.publish())
    res = route(d, toks)
    assert res["pod"] == "w3" and res["matched_blocks"] == 6, res
    wait_score(d, toks, "w3", 6, 12)
    # the engine evicts block 2: nothing past it matches, predicted or not
    r.remove([hashes[2]])
    wait_pod(d, "w3", seq=r.publish())
    wait_score(d, toks, "w3", 2, None)
    wait_metric(d, "route_predicted_blocks_total", 'event="contradicted"', 1)
    # AllBlocksCleared drops the rest of the worker's predictions
    r.clear()
    wait_pod(d, "w3", seq=r.publish())
    assert score_of(d, toks, "w3") is None
    wait_metric(d, "route_predicted_blocks_total", 'event="contradicted"', 12)
    assert metric(d, "route_predicted_blocks", None) == 0


@pytest.mark.parametrize("fleet", [{"predicted_ttl": "1s"}], indirect=True)
def test_ttl_expiry(fleet):
    d = fleet
    toks = tokens_for(9, 10 * BS)
    pod = route(d, toks)["pod"]
    wait_score(d, toks, pod, 0, 10)
    # no event ever confirms it: gone after predicted_ttl
    deadline = time.monotonic() + 10
    while score_of(d, toks, pod) is not None:
        assert time.monotonic() < deadline, score_of(d, toks, pod)
        time.sleep(0.05)
    wait_metric(d, "route_predicted_blocks_total", 'event="expired"', 10)
    assert metric(d, "route_predicted_blocks", None) == 0
    # and the next decision for it is free to go anywhere again, predicted anew
    route(d, toks)
    wait_metric(d, "route_predicted_blocks_total", 'event="stored"', 20)
