"""Session affinity end to end: the real kvrouterd binds a conversation's key (the
X-Session-ID header, a configured header, or the body's "session_id") to the worker of its
last /v1/route decision, keeps the next turns there while ttft finds no worker much faster,
and breaks the bond when that worker's engine reports it busy (its /metrics, scraped) or its
predicted time exceeds the best by more than [route] session_max_wait; a bond idle past
session_ttl is gone; DELETE /v1/pods/POD drops the pod's bonds (a pod forgotten by [events]
forget_after is no default candidate any more: its bonds break as "gone" at their next use,
or idle out). Counted in
kvrouter_route_session_decisions_total. Loopback only; every wait is bounded.
"""

import time

from test_ingest import metric, need_http
from test_load import MODEL, engine_for, load_cfg, vllm_text, wait_metric, worker_labels
from test_load import servers  # noqa: F401  (the fixture)
from vllm_pub import tokens_for


def route(d, seed, session=None, header="X-Session-ID", body_session=None, n=64):
    obj = {"model": MODEL, "token_ids": tokens_for(seed, n)}
    if body_session is not None:
        obj["session_id"] = body_session
    hdrs = {header: session} if session is not None else None
    st, res = d.json("POST", "/v1/route", obj, headers=hdrs)
    assert st == 200, (st, res)
    return res


def outcome(d, name):
    return metric(d, "route_session_decisions_total", 'outcome="%s"' % name) or 0


def approx_cfg(pods, **route):
    cfg = {'model "%s"' % MODEL: {"approximate_pods": ", ".join(pods), "block_size": "16"},
           "route": {"policy": "ttft", "seed": "5", "prefill_rate": "20000"}}
    cfg["route"].update(route)
    return cfg


def test_session_follows_its_worker(daemon_factory):
    """Without a key, ttft spreads a conversation's turns (each turn's prefill is queued on
    the worker it went to); with one, every turn goes to the first turn's worker."""
    pods = ["127.0.0.1:%d" % (9100 + i) for i in range(4)]
    d = daemon_factory(approx_cfg(pods))
    need_http(d)
    free = {route(d, 100 + t)["pod"] for t in range(4)}
    assert len(free) == 4, free  # the in-flight prefills spread key-less requests
    first = route(d, 200, session="conv-1")
    assert first["session"] == "new", first
    for t in range(1, 6):
        res = route(d, 200 + t, session="conv-1")
        assert res["pod"] == first["pod"] and res["session"] == "kept", res
    # another conversation is bound on its own; the body's session_id wins over the header
    other = route(d, 300, session="conv-2")
    assert other["session"] == "new"
    res = route(d, 301, session="conv-2", body_session="conv-1")
    assert res["pod"] == first["pod"] and res["session"] == "kept", res
    assert outcome(d, "kept") == 6 and outcome(d, "new") == 2
    assert metric(d, "route_sessions") == 2
    # a key past 256 bytes is refused, not cut
    st, res = d.json("POST", "/v1/route", {"model": MODEL, "token_ids": tokens_for(1, 64)},
                     headers={"X-Session-ID": "k" * 257})
    assert st == 400 and "session" in res["error"], res


def test_session_breaks_when_its_worker_is_slow(daemon_factory):
    """A bond is broken when ttft predicts its worker more than session_max_wait slower than
    the best (here: a 4,096-token turn queued on it, 0.2 s at 20K tokens/s > 150 ms), then
    bound to the new worker; an idle bond is gone after session_ttl."""
    pods = ["127.0.0.1:%d" % (9200 + i) for i in range(3)]
    d = daemon_factory(approx_cfg(pods, session_max_wait="150ms", session_ttl="1500ms"))
    need_http(d)
    first = route(d, 1, session="s")
    res = route(d, 2, session="s", n=4096)  # 64 tokens ahead: 3 ms slower, kept
    assert res["pod"] == first["pod"] and res["session"] == "kept", res
    res = route(d, 3, session="s")  # 4,160 ahead: 0.21 s slower, broken
    assert res["pod"] != first["pod"] and res["session"] == "slow", res
    again = route(d, 4, session="s")
    assert again["pod"] == res["pod"] and again["session"] == "kept", again
    assert outcome(d, "slow") == 1
    time.sleep(1.7)
    assert route(d, 5, session="s")["session"] == "new"


def test_session_breaks_when_its_worker_is_busy(daemon_factory, servers):  # noqa: F811
    """The bonded worker's engine reports a long queue ([route] busy_waiting): the next turn
    goes elsewhere and the bond moves; DELETE /v1/pods drops the bonds of a pod."""
    a = servers(vllm_text({0: (0, 1, 0.2)}))
    b = servers(vllm_text({0: (0, 1, 0.2)}))
    cfg = load_cfg(approx=[a.pod, b.pod])
    cfg['model "%s"' % MODEL]["block_size"] = "16"
    cfg["route"] = {"policy": "ttft", "busy_waiting": "10", "seed": "3",
                    "session_header": "X-Conversation"}
    d = daemon_factory(cfg)
    need_http(d)
    wait_metric(d, "load_kv_cache_usage_ratio", worker_labels(a.pod), lambda v: v == 0.2)
    wait_metric(d, "load_kv_cache_usage_ratio", worker_labels(b.pod), lambda v: v == 0.2)
    first = route(d, 1, session="c", header="X-Conversation")
    assert first["session"] == "new"
    # the default header is not this daemon's: no session at all
    assert "session" not in route(d, 2, session="c")
    bonded, other = (a, b) if first["pod"] == a.pod else (b, a)
    bonded.body = vllm_text({0: (40, 8, 0.5)})
    wait_metric(d, "load_waiting_requests", worker_labels(bonded.pod), lambda v: v == 40)
    res = route(d, 3, session="c", header="X-Conversation")
    assert res["pod"] == other.pod and res["session"] == "busy", res
    res = route(d, 4, session="c", header="X-Conversation")
    assert res["pod"] == other.pod and res["session"] == "kept", res
    assert metric(d, "route_sessions") == 1


def test_deleted_pod_drops_its_bonds(daemon_factory):
    """DELETE /v1/pods/POD (the operator forgets an engine) drops the bonds to it."""
    d = daemon_factory({"route": {"policy": "ttft"}})
    need_http(d)
    eng = engine_for(d, "127.0.0.1:9400")
    try:
        for k in ("a", "b"):
            st, res = d.json("POST", "/v1/route", {"model": MODEL, "token_ids": tokens_for(7, 64)},
                             headers={"X-Session-ID": k})
            assert st == 200 and res["pod"] == "127.0.0.1:9400" and res["session"] == "new", res
        assert metric(d, "route_sessions") == 2
        st, res = d.json("DELETE", "/v1/pods/127.0.0.1:9400", admin=True)
        assert st == 200 and res["session_bonds"] == 2, res
        assert metric(d, "route_sessions") == 0
    finally:
        eng.close()


def test_sessions_off(daemon_factory):
    pods = ["127.0.0.1:%d" % (9300 + i) for i in range(2)]
    d = daemon_factory(approx_cfg(pods, session_ttl="0"))
    need_http(d)
    assert "session" not in route(d, 1, session="x")
    assert metric(d, "route_sessions") == 0


def test_session_header_on_a_text_thread(daemon_factory):
    """A /v1/route whose prompt is tokenized on a text thread ([tokenizer] offload_bytes)
    keeps its session header: the job carries its own copy of it."""
    from test_text_threads import cfg as text_cfg, prose, start
    c = text_cfg(["qwen3"], tokenizer={"offload_bytes": "1KiB"})
    pods = ["127.0.0.1:%d" % (9600 + i) for i in range(4)]
    c['model "test/qwen3"'].update({"approximate_pods": ", ".join(pods)})
    c["route"] = {"policy": "ttft", "seed": "3"}
    d = start(daemon_factory, c)
    first = None
    for t in range(4):
        st, res = d.json("POST", "/v1/route", {"model": "test/qwen3", "prompt": prose(8192, t)},
                         headers={"X-Session-ID": "long-conversation"})
        assert st == 200, res
        if first is None:
            first = res
            assert res["session"] == "new", res
        else:
            assert res["pod"] == first["pod"] and res["session"] == "kept", res
    assert (metric(d, "text_jobs_total") or 0) >= 4  # they did run on a text thread
    assert (metric(d, "route_session_decisions_total", 'outcome="kept"') or 0) == 3
