"""POST /v1/route end to end: engines publish through the real event path, the daemon picks
one worker per query by policy, tracks loads, and reloads its [route] settings.

What a routing decision must do is computed here from what the engines hold (each engine's
LRU cache in vllm_pub), not read back from the daemon.
"""

import pytest

from kvrharness import render_config
from test_ingest import need_http, wait_pod, warm
from vllm_pub import Engine, tokens_for

MODEL = "test/route"
BS = 16


def route(d, body, status=200):
    st, res = d.json("POST", "/v1/route", body)
    assert st == status, res
    return res


@pytest.fixture
def fleet(daemon_factory):
    """A daemon and three engines (pod-a, pod-b, pod-c), each holding its own prompt."""
    # predicted_ttl 0: these tests follow the policies over what the engines hold; a decision
    # predicting its prompt on the chosen worker (test_predict.py) would change later ones
    d = daemon_factory({"route": {"policy": "cost", "seed": "7", "predicted_ttl": "0"}})
    need_http(d)
    engines, prompts = [], {}
    d.engines = {}
    try:
        for i, pod in enumerate(("pod-a", "pod-b", "pod-c")):
            e = Engine(pod=pod, model=MODEL, mode="connect", endpoints=d.events, block_size=BS,
                       num_blocks=512)
            e.__enter__()
            engines.append(e)
            d.engines[pod] = e
            warm(e, d, pod)
            prompts[pod] = tokens_for(100 + i, 20 * BS + 5)
            r = e.rank(0)
            r.request(prompts[pod])
            wait_pod(d, pod, seq=r.publish())
        yield d, prompts
    finally:
        for e in engines:
            e.__exit__(None, None, None)


def test_routes_to_the_holder(fleet):
    d, prompts = fleet
    for pod, toks in prompts.items():
        res = route(d, {"model": MODEL, "token_ids": toks})
        assert res["pod"] == pod and res["dp_rank"] == 0, res
        assert res["matched_blocks"] == 20 and res["query_blocks"] == 20
        assert res["policy"] == "cost" and res["reason"].startswith("lowest cost")
        # every worker of the model is a candidate; costs: 0 for the holder, 20 for others
        cands = {c["pod"]: c for c in res["candidates"]}
        assert set(cands) == {"pod-a", "pod-b", "pod-c"}
        for p, c in cands.items():
            assert c["cost"] == (0 if p == pod else 20)
    # half of pod-b's prompt, then something new: pod-b still holds the head
    toks = prompts["pod-b"][:10 * BS] + tokens_for(999, 10 * BS)
    res = route(d, {"model": MODEL, "token_ids": toks})
    assert res["pod"] == "pod-b" and res["matched_blocks"] == 10


def test_loads_change_the_choice(fleet):
    d, prompts = fleet
    a = prompts["pod-a"]
    # cost: pod-a saves 20 prefill blocks but has 40 blocks of decode in flight
    cands = [{"pod": "pod-a", "active_tokens": 40 * BS}, {"pod": "pod-b"}, {"pod": "pod-c"}]
    res = route(d, {"model": MODEL, "token_ids": a, "candidates": cands})
    assert res["pod"] in ("pod-b", "pod-c"), res
    cands[0]["active_tokens"] = 10 * BS
    assert route(d, {"model": MODEL, "token_ids": a, "candidates": cands})["pod"] == "pod-a"
    # cache_aware: imbalanced loads (200 vs 0 > 64 and > 1.5x) -> the least loaded
    cands = [{"pod": "pod-a", "active_requests": 200}, {"pod": "pod-b", "active_requests": 0},
             {"pod": "pod-c", "active_requests": 3}]
    res = route(d, {"model": MODEL, "token_ids": a, "candidates": cands, "policy": "cache_aware"})
    assert res["pod"] == "pod-b" and "imbalanced" in res["reason"], res
    cands[0]["active_requests"] = 5
    res = route(d, {"model": MODEL, "token_ids": a, "candidates": cands, "policy": "cache_aware"})
    assert res["pod"] == "pod-a" and "best match rate 1.000" in res["reason"], res
    # a prompt nobody holds: least loaded
    res = route(d, {"model": MODEL, "token_ids": tokens_for(5, 8 * BS), "candidates": cands,
                    "policy": "cache_aware"})
    assert res["pod"] == "pod-b" and "least loaded" in res["reason"], res
    # score: as /v1/score ranks
    res = route(d, {"model": MODEL, "token_ids": prompts["pod-c"], "policy": "score"})
    assert res["pod"] == "pod-c" and res["policy"] == "score"
    # a candidate the index never saw is scored 0 but can still be chosen
    res = route(d, {"model": MODEL, "token_ids": tokens_for(6, 8 * BS),
                    "candidates": [{"pod": "new-pod", "dp_rank": 3}]})
    assert res["pod"] == "new-pod" and res["dp_rank"] == 3 and res["matched_blocks"] == 0


def test_tracked_loads(fleet):
    d, prompts = fleet
    a = prompts["pod-a"]
    res = route(d, {"model": MODEL, "token_ids": a, "track": True})
    assert res["pod"] == "pod-a" and len(res["route_id"]) == 16
    ids = [res["route_id"]]
    st, pods = d.json("GET", "/v1/pods", admin=True)
    entry = next(p for p in pods["pods"] if p["pod"] == "pod-a")
    assert entry["active_requests"] == 1 and entry["active_tokens"] == len(a)
    # pod-a's tracked decode load (325 tokens: 21 blocks) now outweighs the 20 blocks its
    # cache saves: the same prompt goes elsewhere
    res = route(d, {"model": MODEL, "token_ids": a})
    assert res["pod"] != "pod-a", res
    cand = {c["pod"]: c for c in res["candidates"]}
    assert cand["pod-a"]["cost"] == 21 and cand["pod-a"]["active_requests"] == 1
    # two more tracked on pod-c through an explicit candidate list
    for _ in range(2):
        res = route(d, {"model": MODEL, "token_ids": a, "track": True,
                        "candidates": [{"pod": "pod-c"}]})
        assert res["pod"] == "pod-c"
        ids.append(res["route_id"])
    st, pods = d.json("GET", "/v1/pods", admin=True)
    assert next(p for p in pods["pods"] if p["pod"] == "pod-c")["active_requests"] == 2
    for i in ids:
        st, body = d.json("DELETE", "/v1/routes/" + i)
        assert st == 200 and body == {"ended": True}
    st, _ = d.json("DELETE", "/v1/routes/" + ids[0])
    assert st == 404
    assert route(d, {"model": MODEL, "token_ids": a})["pod"] == "pod-a"
    st, _, m = d.request("GET", "/metrics", admin=True)
    text = m.decode()
    assert "kvrouter_route_tracked 0" in text and "kvrouter_route_ended_total 3" in text


def test_errors_and_reload(fleet, tmp_path):
    d, prompts = fleet
    route(d, {"model": "nobody", "token_ids": [1, 2, 3]}, status=503)
    route(d, {"model": MODEL, "token_ids": [1], "policy": "fastest"}, status=400)
    route(d, {"model": MODEL, "token_ids": [1], "candidates": [{"dp_rank": 1}]}, status=400)
    route(d, {"model": MODEL, "token_ids": [1], "candidates": {"pod": "x"}}, status=400)
    route(d, {"model": MODEL, "token_ids": [1], "track": 1}, status=400)
    route(d, {"model": MODEL, "prompt": "no tokenizer here"}, status=400)
    st, _, _ = d.request("POST", "/v1/route", b"\x81\xa5model\xa1m",
                         headers={"Content-Type": "application/msgpack"})
    assert st == 415
    st, _, _ = d.request("GET", "/v1/route")
    assert st == 405
    # SIGHUP: [route] policy becomes score
    with open(d.conf_path, "w") as f:
        f.write(render_config(d.config | {"route": {"policy": "score", "seed": "7"}}))
    m = d.reload()
    assert m.group(1) == "ok", d.stderr_text()[-2000:]
    assert "route.policy" in d.stderr_text()
    assert route(d, {"model": MODEL, "token_ids": prompts["pod-a"]})["policy"] == "score"


def pods_by_name(d):
    st, body = d.json("GET", "/v1/pods", admin=True)
    assert st == 200
    return {p["pod"]: p for p in body["pods"]}


def test_ttft_spreads_a_burst_and_events_confirm(fleet):
    """No loads from the gateway, no engine metrics: a burst of new prompts is spread by the
    work kvrouterd itself routed (each decision queues its uncached tokens at once), and the
    chosen engine's KV events confirm a prefill (it leaves the queue, counts as decoding)."""
    d, prompts = fleet
    burst = [tokens_for(5000 + i, 32 * BS) for i in range(6)]
    chosen = []
    for toks in burst:
        res = route(d, {"model": MODEL, "token_ids": toks, "policy": "ttft"})
        assert res["policy"] == "ttft" and "predicted time to first token" in res["reason"]
        chosen.append(res["pod"])
        for c in res["candidates"]:
            assert c["uncached_tokens"] == 32 * BS and "ttft" in c and "queued_tokens" in c
    # 6 equal prefills over 3 workers: 2 each (each decision sees the ones before it)
    assert sorted(chosen.count(p) for p in ("pod-a", "pod-b", "pod-c")) == [2, 2, 2], chosen
    pods = pods_by_name(d)
    for p in ("pod-a", "pod-b", "pod-c"):
        assert pods[p]["inflight"]["prefills"] == 2, pods[p]
        assert pods[p]["inflight"]["prefill_tokens"] == 2 * 32 * BS
    # the engine that got burst[0] computes it: its BlockStored events confirm the prefill
    target = chosen[0]
    r = d.engines[target].rank(0)
    r.request(burst[0])
    wait_pod(d, target, seq=r.publish())
    pods = pods_by_name(d)
    f = pods[target]["inflight"]
    assert f["prefills"] == 1 and f["prefill_tokens"] == 32 * BS, f
    assert f["confirmed"] == 1 and f["decoding"] >= 1 and f["prefill_rate"] > 0, f
    text = d.request("GET", "/metrics", admin=True)[2].decode()
    assert "kvrouter_route_prefills_confirmed_total 1" in text
    # the next new prompt avoids the two workers that still have 2 prefills queued
    res = route(d, {"model": MODEL, "token_ids": tokens_for(6000, 32 * BS), "policy": "ttft"})
    assert res["pod"] == target, res
