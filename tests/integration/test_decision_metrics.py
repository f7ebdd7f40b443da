"""Decision metrics and recovery progress on the real daemon.

- The counters add up: a known sequence of /v1/route and /v1/score requests against engines
  whose caches are known; the sums, branches and per-worker series are computed here from
  the answers (and the engines' prompts), then compared with GET /metrics, and the
  block-weighted rates (predicted hit rate, chosen vs best) with the ratio of the exported sums.
- Per-worker series go away with DELETE /v1/pods.
- Recovery progress moves during a replay: a slow replay ROUTER, /metrics polled while it
  runs, log lines at its start and end.
- /readyz waits for [events] min_streams_ready.
"""

import re
import time

import pytest

from test_ingest import need_http, wait_pod, warm
from vllm_pub import Engine, tokens_for

MODEL = "test/decide"
BS = 16
WAIT = 10.0


def scrape(d):
    """{(name, frozenset(labels)): value} of every sample in GET /metrics."""
    status, _, body = d.request("GET", "/metrics", admin=True)
    assert status == 200
    out = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, line
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def val(samples, name, **labels):
    return samples.get(("kvrouter_" + name, frozenset(labels.items())))


def route(d, body, status=200):
    st, res = d.json("POST", "/v1/route", body)
    assert st == status, res
    return res


@pytest.fixture
def fleet(daemon_factory):
    d = daemon_factory({"route": {"policy": "cost", "seed": "11"}})
    need_http(d)
    engines, prompts = [], {}
    try:
        for i, pod in enumerate(("pod-a", "pod-b", "pod-c")):
            e = Engine(pod=pod, model=MODEL, mode="connect", endpoints=d.events, block_size=BS,
                       num_blocks=512)
            e.__enter__()
            engines.append(e)
            warm(e, d, pod)
            prompts[pod] = tokens_for(700 + i, 20 * BS + 5)
            r = e.rank(0)
            r.request(prompts[pod])
            wait_pod(d, pod, seq=r.publish())
        yield d, prompts
    finally:
        for e in engines:
            e.__exit__(None, None, None)


def test_counters_add_up(fleet):
    d, prompts = fleet
    a, b = prompts["pod-a"], prompts["pod-b"]
    bodies = [
        {"model": MODEL, "token_ids": a},                                   # cache: 20/20
        {"model": MODEL, "token_ids": b},                                   # cache: 20/20
        {"model": MODEL, "token_ids": b[:10 * BS] + tokens_for(901, 10 * BS)},   # cache: 10/20
        {"model": MODEL, "token_ids": tokens_for(902, 12 * BS)},            # fallback: 0/12
        # load wins: pod-a holds 20 blocks but has 40 blocks of decode in flight
        {"model": MODEL, "token_ids": a,
         "candidates": [{"pod": "pod-a", "active_tokens": 40 * BS}, {"pod": "pod-b"},
                        {"pod": "pod-c"}]},
        {"model": MODEL, "token_ids": a, "policy": "cache_aware"},          # cache: 20/20
        {"model": MODEL, "token_ids": tokens_for(903, 7 * BS + 3), "policy": "score"},  # fallback
    ]
    want = {}      # (policy) -> [decisions, query, chosen, best]
    branches = {}  # (policy, branch) -> n
    workers = {}   # pod -> [decisions, matched, prompt tokens]
    for body in bodies:
        res = route(d, body)
        pol = res["policy"]
        best = max(c["matched_blocks"] for c in res["candidates"])
        w = want.setdefault(pol, [0, 0, 0, 0])
        w[0] += 1
        w[1] += res["query_blocks"]
        w[2] += res["matched_blocks"]
        w[3] += best
        br = "fallback" if best == 0 else "cache" if res["matched_blocks"] == best else "load"
        branches[(pol, br)] = branches.get((pol, br), 0) + 1
        ws = workers.setdefault(res["pod"], [0, 0, 0])
        ws[0] += 1
        ws[1] += res["matched_blocks"]
        ws[2] += len(body["token_ids"])
    assert branches.get(("cost", "load")) == 1, branches  # the sequence covers each branch
    assert branches.get(("cost", "fallback")) == 1 and branches.get(("score", "fallback")) == 1
    # scored queries: summed under endpoint="score"
    sq = sb = 0
    for toks in (a, b[:5 * BS]):
        st, res = d.json("POST", "/v1/score", {"model": MODEL, "token_ids": toks})
        assert st == 200, res
        sq += res["query_blocks"]
        sb += max(s["matched_blocks"] for s in res["scores"])
    # no candidate: a model nobody serves
    st, _ = d.json("POST", "/v1/route", {"model": "nobody/serves", "token_ids": a})
    assert st == 503

    m = scrape(d)
    for pol, (n, q, ch, best) in want.items():
        lab = dict(endpoint="route", model=MODEL, policy=pol)
        assert val(m, "decision_total", **lab) == n, (pol, m)
        assert val(m, "decision_query_blocks_total", **lab) == q
        assert val(m, "decision_chosen_matched_blocks_total", **lab) == ch
        assert val(m, "decision_best_matched_blocks_total", **lab) == best
    for (pol, br), n in branches.items():
        assert val(m, "decision_branch_total", policy=pol, branch=br) == n, (pol, br)
    assert val(m, "decision_branch_total", policy="cost", branch="no_candidate") == 1  # [route] policy
    assert val(m, "decision_total", endpoint="route", model="nobody/serves", policy="cost") == 1
    # the block-weighted rates, by hand and from the exported sums
    q = sum(w[1] for w in want.values())
    ch = sum(w[2] for w in want.values())
    best = sum(w[3] for w in want.values())
    assert (q, ch, best) == (20 + 20 + 20 + 12 + 20 + 20 + 7, 20 + 20 + 10 + 0 + 0 + 20 + 0,
                             20 + 20 + 10 + 0 + 20 + 20 + 0)
    exp_q = sum(v for (n, lab), v in m.items()
                if n == "kvrouter_decision_query_blocks_total" and ("endpoint", "route") in lab
                and ("model", MODEL) in lab)
    exp_ch = sum(v for (n, lab), v in m.items()
                 if n == "kvrouter_decision_chosen_matched_blocks_total" and ("model", MODEL) in lab)
    exp_best = sum(v for (n, lab), v in m.items()
                   if n == "kvrouter_decision_best_matched_blocks_total"
                   and ("endpoint", "route") in lab and ("model", MODEL) in lab)
    assert exp_ch / exp_q == pytest.approx(70 / 119)
    assert exp_ch / exp_best == pytest.approx(70 / 90)
    for pod, (n, mb, pt) in workers.items():
        lab = dict(pod=pod, dp_rank="0")
        assert val(m, "decision_worker_total", **lab) == n, pod
        assert val(m, "decision_worker_matched_blocks_total", **lab) == mb
        assert val(m, "decision_worker_matched_tokens_total", **lab) == mb * BS
        assert val(m, "decision_worker_prompt_tokens_total", **lab) == pt
    assert val(m, "decision_query_blocks_total", endpoint="score", model=MODEL,
               policy="none") == sq
    assert val(m, "decision_best_matched_blocks_total", endpoint="score", model=MODEL,
               policy="none") == sb
    assert val(m, "decision_duration_seconds_count", endpoint="route",
               input="tokens") == len(bodies)
    assert val(m, "decision_duration_seconds_count", endpoint="score", input="tokens") == 2

    # DELETE /v1/pods: the pod's worker series go
    chosen = sorted(workers)[0]
    st, _ = d.json("DELETE", "/v1/pods/" + chosen, admin=True)
    assert st == 200
    m = scrape(d)
    assert val(m, "decision_worker_total", pod=chosen, dp_rank="0") is None
    assert val(m, "decision_workers") == len(workers) - 1


def test_replay_progress_moves(daemon_factory):
    with Engine(pod="pod-slow", model=MODEL, mode="bind", replay=True, block_size=BS) as eng:
        r = eng.rank(0)
        d = daemon_factory({"events": {"bind": None, "replay_timeout": "30s",
                                       "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                    r.replay_endpoint)}})
        need_http(d)
        warm(eng, d, "pod-slow")
        m = scrape(d)
        assert val(m, "recovery_replay_streams") == 0
        assert val(m, "recovery_replay_batches_requested") == 0
        base = r.seq
        nlost = 30
        r.drop = set(range(base, base + nlost))
        r.replay_delay = 0.05  # 1.5 s of replay
        mark = d.log_mark()
        for i in range(nlost + 1):
            r.request(tokens_for(1000 + i, BS))
            seq = r.publish()
        d.wait_log(r"recovery: replays started", since=mark)
        seen = []  # (requested, received) while replaying
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            m = scrape(d)
            if val(m, "recovery_replay_streams") == 1:
                seen.append((val(m, "recovery_replay_batches_requested"),
                             val(m, "recovery_replay_batches_received")))
            elif seen:
                break
            time.sleep(0.05)
        assert seen, "never saw the stream replaying"
        assert all(req == nlost for req, _ in seen), seen
        got = [rcv for _, rcv in seen]
        assert got == sorted(got), got                      # it only moves forward
        assert any(0 < x < nlost for x in got), got         # and was seen mid-way
        assert got[-1] > got[0], got
        wait_pod(d, "pod-slow", seq=seq, state="synced")
        line = d.wait_log(r"recovery: replays finished in ([0-9.]+) s: 1 streams, (\d+) "
                          r"batches replayed, 0 streams unsynced", since=mark)
        # the ROUTER also sends the batch that revealed the gap (applied from the replay; the
        # buffered copy is then a duplicate)
        assert float(line.group(1)) >= 1.0 and nlost <= int(line.group(2)) <= nlost + 1
        m = scrape(d)
        assert val(m, "recovery_replay_streams") == 0
        assert val(m, "recovery_replay_batches_requested") == 0
        assert val(m, "recovery_snapshot_info", source="none") == 1


def test_readyz_waits_for_min_streams(daemon_factory):
    d = daemon_factory({"events": {"min_streams_ready": "2"}})
    need_http(d)
    st, body = d.json("GET", "/readyz")
    assert st == 503 and "0 of [events] min_streams_ready = 2" in body["error"], body
    m = scrape(d)
    assert val(m, "ready") == 0 and val(m, "ready_min_streams") == 2
    with Engine(pod="pod-r1", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as e1:
        warm(e1, d, "pod-r1")
        st, body = d.json("GET", "/readyz")
        assert st == 503 and "1 of" in body["error"], body
        with Engine(pod="pod-r2", model=MODEL, mode="connect", endpoints=d.events,
                    block_size=BS) as e2:
            warm(e2, d, "pod-r2")
            st, body = d.json("GET", "/readyz")
            assert st == 200 and body == {"ready": True}
            assert val(scrape(d), "ready") == 1
