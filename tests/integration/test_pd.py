"""Disaggregated prefill and decode end to end: the real kvrouterd answers /v1/route for a
model whose workers have roles ([model] prefill_pods / decode_pods, or the gateway's
candidates' "role") with a pair: the decode worker (where the request goes: "pod") chosen by
load, and, when the uncached part is long enough ([route] pd_local_max_uncached), the prefill
worker chosen by the policy ("prefill", "disaggregate": true); a short one stays on the decode
worker ("disaggregate": false). Counted in kvrouter_route_pd_decisions_total. Loopback only.
"""

from kvrharness import run_kvr
from test_ingest import metric, need_http
from vllm_pub import tokens_for

MODEL = "test/pd"
PRE = ["10.0.0.1:8000", "10.0.0.2:8000"]
DEC = ["10.0.1.1:8000", "10.0.1.2:8000"]


def pd_cfg(**route):
    r = {"policy": "ttft", "seed": "11"}
    r.update(route)
    return {'model "%s"' % MODEL: {"prefill_pods": ", ".join(PRE),
                                   "decode_pods": " ".join(DEC), "block_size": "16"},
            "route": r}


def route(d, n, seed, cands=None, status=200):
    body = {"model": MODEL, "token_ids": tokens_for(seed, n)}
    if cands is not None:
        body["candidates"] = cands
    st, res = d.json("POST", "/v1/route", body)
    assert st == status, (st, res)
    return res


def test_roles_from_the_config(daemon_factory):
    d = daemon_factory(pd_cfg())
    need_http(d)
    used = set()
    for seed in range(6):  # long prompts: a pair, spread by load on both sides
        res = route(d, 4096, seed)
        assert res["disaggregate"] is True, res
        assert res["prefill"]["pod"] in PRE and res["pod"] in DEC, res
        assert res["decode"] == {"pod": res["pod"], "dp_rank": 0}
        used.add((res["prefill"]["pod"], res["pod"]))
        roles = {c["pod"]: c.get("role") for c in res["candidates"]}
        assert roles == dict([(p, "prefill") for p in PRE] + [(p, "decode") for p in DEC])
    assert len({p for p, _ in used}) == 2 and len({q for _, q in used}) == 2, used
    res = route(d, 512, 100)  # short: the decode worker alone
    assert res["disaggregate"] is False and "prefill" not in res and res["pod"] in DEC, res
    assert "decode worker alone" in res["reason"]
    assert metric(d, "route_pd_decisions_total", 'kind="split"') == 6
    assert metric(d, "route_pd_decisions_total", 'kind="local"') == 1
    # a gateway that lists the decode engines it forwards to: the prefill pool is added
    res = route(d, 8192, 9, [{"pod": p} for p in DEC])
    assert res["disaggregate"] is True and res["prefill"]["pod"] in PRE, res
    # /v1/pods lists the configured roles (the pools publish no events here)
    st, pods = d.json("GET", "/v1/pods", admin=True)
    assert st == 200, pods
    conf = sorted((x["pod"], x["role"]) for x in pods["roles"] if x["source"] == "config")
    assert conf == sorted([(p, "prefill") for p in PRE] + [(p, "decode") for p in DEC]), pods
    assert all(x["model"] == MODEL and "dp_rank" not in x for x in pods["roles"]
               if x["source"] == "config"), pods


def test_threshold_and_gateway_roles(daemon_factory):
    d = daemon_factory(pd_cfg(pd_local_max_uncached="100000"))
    need_http(d)
    assert route(d, 4096, 1)["disaggregate"] is False  # under the raised threshold
    cands = [{"pod": "p-a", "role": "prefill"}, {"pod": "d-a", "role": "decode"},
             {"pod": "both-a"}]
    d2 = daemon_factory({"route": {"policy": "ttft", "seed": "11"}})  # roles from the body
    need_http(d2)
    res = route(d2, 4096, 2, cands)
    assert res["pod"] in ("d-a", "both-a") and res["disaggregate"] is True, res
    assert res["prefill"]["pod"] in ("p-a", "both-a") and res["prefill"]["pod"] != res["pod"]
    # /v1/pods: the roles the gateway gave with the decisions routed to each worker
    st, pods = d2.json("GET", "/v1/pods", admin=True)
    assert st == 200, pods
    seen = {(x["pod"], x["dp_rank"]): x for x in pods["roles"]}
    role = {"p-a": "prefill", "d-a": "decode"}  # both-a came without one
    for pod in (res["pod"], res["prefill"]["pod"]):
        if pod in role:
            x = seen.pop((pod, 0))
            assert x["role"] == role[pod] and x["source"] == "gateway", x
            assert 0 <= x["idle_ms"] < 10000, x
    assert not seen, pods  # only the workers a decision went to, with a role given
    # no role at all among the candidates: an ordinary decision, no pair
    res = route(d2, 4096, 3, [{"pod": "x"}, {"pod": "y"}])
    assert "disaggregate" not in res and "prefill" not in res
    # prefill workers only: nothing can decode
    res = route(d2, 4096, 4, [{"pod": "p-a", "role": "prefill"}], status=503)
    assert "decode" in res["error"]
    res = route(d2, 64, 5, [{"pod": "p-a", "role": "primary"}], status=400)
    assert "role" in res["error"]


def test_a_pod_in_both_lists_is_refused(tmp_path):
    conf = tmp_path / "k.conf"
    conf.write_text('[events]\nbind = tcp://127.0.0.1:*\n[model "m"]\nprefill_pods = a, b\n'
                    'decode_pods = b\n')
    res = run_kvr(["-t", "-c", str(conf)])
    assert res.returncode != 0 and "both prefill_pods and decode_pods" in res.stderr, res.stderr
