"""Event ingestion end to end: vllm_pub engines → the real kvrouterd → HTTP API.

Observed through GET /v1/pods (last_seq, state, gaps, replays, restarts, blocks, tiers),
POST /v1/score (matched_blocks, tiers) and GET /metrics. Every wait is bounded.
"""

import re
import threading
import time

import pytest

from vllm_pub import Engine, tokens_for

MODEL = "test/llama"
BS = 16
WAIT = 10.0


def need_http(d):
    if "http" not in d.ready:
        pytest.skip("this kvrouterd build does not serve HTTP yet (no http= in the ready line)")


def start(daemon_factory, events=None, **kw):
    cfg = {"events": events} if events else None
    d = daemon_factory(cfg, **kw)
    need_http(d)
    return d


def pods(d):
    status, body = d.json("GET", "/v1/pods", admin=True)
    assert status == 200, body
    return body["pods"]


def pod_entry(d, pod, rank=0):
    for p in pods(d):
        if p["pod"] == pod and p["dp_rank"] == rank:
            return p
    return None


def wait_pod(d, pod, rank=0, seq=None, state=None, pred=None, timeout=WAIT):
    """Waits until the stream (pod, rank) exists, reached seq/state and pred(entry) holds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pod_entry(d, pod, rank)
        if last is not None and (seq is None or last["last_seq"] == seq) \
                and (state is None or last["state"] == state) \
                and (pred is None or pred(last)):
            return last
        time.sleep(0.02)
    raise AssertionError("pod %s/%d never reached seq=%s state=%s; last=%r; stderr tail:\n%s"
                         % (pod, rank, seq, state, last, d.stderr_text()[-3000:]))


def score(d, tokens, lora=None, model=MODEL):
    body = {"model": model, "token_ids": tokens}
    if lora is not None:
        body["lora_name"] = lora
    status, res = d.json("POST", "/v1/score", body)
    assert status == 200, res
    return res


def matched(d, tokens, pod, rank=0, lora=None, tier=None):
    for s in score(d, tokens, lora)["scores"]:
        if s["pod"] == pod and s["dp_rank"] == rank:
            if tier is not None:
                return s.get("tiers", {}).get(tier, 0)
            return s["matched_blocks"]
    return 0


def metric(d, name, labels=None):
    status, _, body = d.request("GET", "/metrics", admin=True)
    assert status == 200
    key = "kvrouter_%s%s " % (name, "{%s}" % labels if labels else "")
    for line in body.decode().splitlines():
        if line.startswith(key):
            return float(line[len(key):])
    return None


def warm(eng, d, pod, rank=0):
    """Slow joiner: the XPUB sees the subscription; then one empty batch makes the stream
    known (its seq is the baseline)."""
    eng.wait_subscriber()
    r = eng.rank(rank)
    seq = r.publish()
    wait_pod(d, pod, rank, seq=seq)
    return seq


# ---- bind mode (engines connect to our SUB) -----------------------------------------------

@pytest.mark.parametrize("encoding", ["map", "array"])
def test_bind_mode_store_remove_score(daemon_factory, encoding):
    d = start(daemon_factory)
    with Engine(pod="pod-b", model=MODEL, mode="connect", endpoints=d.events, block_size=BS,
                num_blocks=22, encoding=encoding) as eng:
        warm(eng, d, "pod-b")
        r = eng.rank(0)
        prompt = tokens_for(1, 10 * BS + 3)
        r.request(prompt)
        seq = r.publish()
        p = wait_pod(d, "pod-b", seq=seq, state="synced")
        assert p["blocks"] == 10
        assert p["model"] == MODEL
        assert matched(d, prompt, "pod-b") == 10
        res = score(d, prompt)
        assert res["block_size"] == BS and res["query_blocks"] == 10
        # A second prompt sharing the first 4 blocks; the pool (22 blocks) must evict.
        other = prompt[:4 * BS] + tokens_for(2, 14 * BS)
        hit, stored, removed = r.request(other)
        assert hit == 4 and len(stored) == 14 and removed
        seq = r.publish()
        p = wait_pod(d, "pod-b", seq=seq)
        assert p["blocks"] == len(r.cache.cached)  # the index mirrors the engine's cache
        assert matched(d, other, "pod-b") == 18
        # The evicted tail blocks of the first prompt are gone, its shared head is not.
        assert 4 <= matched(d, prompt, "pod-b") < 10
        assert metric(d, "events_gaps_total") == 0


def test_dp_ranks(daemon_factory):
    d = start(daemon_factory, {"bind": ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]})
    assert len(d.events) == 2
    with Engine(pod="pod-dp", model=MODEL, mode="connect", endpoints=d.events, dp_size=2,
                block_size=BS) as eng:
        eng.wait_subscriber()
        a, b = tokens_for(10, 6 * BS), tokens_for(11, 3 * BS)
        eng.rank(0).request(a)
        s0 = eng.rank(0).publish()
        eng.rank(1).request(b)
        eng.rank(1).publish()
        s1 = eng.rank(1).publish()
        wait_pod(d, "pod-dp", 0, seq=s0)
        wait_pod(d, "pod-dp", 1, seq=s1)
        assert matched(d, a, "pod-dp", 0) == 6 and matched(d, a, "pod-dp", 1) == 0
        assert matched(d, b, "pod-dp", 1) == 3 and matched(d, b, "pod-dp", 0) == 0
        # Same topic on both ranks, separate seqs: no gap, no restart.
        for rank in (0, 1):
            p = pod_entry(d, "pod-dp", rank)
            assert p["gaps"] == 0 and p["restarts"] == 0 and p["state"] == "synced"


def test_restart_purges(daemon_factory):
    d = start(daemon_factory)
    with Engine(pod="pod-r", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        warm(eng, d, "pod-r")
        r = eng.rank(0)
        first = tokens_for(20, 5 * BS)
        r.request(first)
        for _ in range(3):
            seq = r.publish()
        wait_pod(d, "pod-r", seq=seq)
        assert matched(d, first, "pod-r") == 5
        r.restart()  # seq back to 0, no AllBlocksCleared
        second = tokens_for(21, 2 * BS)
        r.request(second)
        seq = r.publish()
        assert seq == 0
        p = wait_pod(d, "pod-r", seq=0, pred=lambda p: p["restarts"] == 1)
        assert p["state"] == "synced"
        assert p["blocks"] == 2
        assert matched(d, first, "pod-r") == 0
        assert matched(d, second, "pod-r") == 2
        assert metric(d, "events_restarts_total") == 1


def test_gap_without_replay_unsynced(daemon_factory):
    d = start(daemon_factory)
    with Engine(pod="pod-g", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        warm(eng, d, "pod-g")
        r = eng.rank(0)
        r.drop = {r.seq + 1}
        r.request(tokens_for(30, 2 * BS))
        r.publish()
        r.request(tokens_for(31, 2 * BS))
        r.publish()  # dropped
        r.request(tokens_for(32, 2 * BS))
        seq = r.publish()
        p = wait_pod(d, "pod-g", seq=seq, state="unsynced")
        assert p["gaps"] == 1
        assert p["blocks"] == 4  # what arrived was applied
        assert metric(d, "events_unsynced_streams") == 1
        # AllBlocksCleared resynchronizes the stream.
        r.clear()
        seq = r.publish()
        p = wait_pod(d, "pod-g", seq=seq, state="synced")
        assert p["blocks"] == 0


def test_bytes_hashes_lora_cpu(daemon_factory):
    d = start(daemon_factory)
    with Engine(pod="pod-x", model=MODEL, mode="connect", endpoints=d.events, block_size=BS,
                hash_mode="bytes", encoding="map") as eng:
        warm(eng, d, "pod-x")
        r = eng.rank(0)
        base = tokens_for(40, 4 * BS)
        lora = tokens_for(41, 3 * BS)
        r.request(base)
        r.request(lora, lora_name="sql-adapter")
        r.store(tokens_for(42, 2 * BS), medium="CPU")
        seq = r.publish()
        p = wait_pod(d, "pod-x", seq=seq)
        assert p["blocks"] == 4 + 3 + 2
        assert matched(d, base, "pod-x") == 4
        assert matched(d, lora, "pod-x", lora="sql-adapter") == 3
        assert matched(d, lora, "pod-x") == 0
        assert matched(d, tokens_for(42, 2 * BS), "pod-x", tier="cpu") == 2
        # Removal keyed by the 32-byte digests' u64 projection.
        h = r.chain(base)
        r.remove(h[3:])
        seq = r.publish()
        wait_pod(d, "pod-x", seq=seq)
        assert matched(d, base, "pod-x") == 3


# ---- connect mode (our SUB dials the engine PUB) ------------------------------------------

@pytest.mark.parametrize("fmt", ["v0.24", "v0.25"])
def test_replay_recovers_dropped_batches(daemon_factory, fmt):
    with Engine(pod="pod-rp", model=MODEL, mode="bind", replay=True, replay_format=fmt,
                block_size=BS) as eng:
        r = eng.rank(0)
        d = start(daemon_factory, {"bind": None,
                                   "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                r.replay_endpoint)})
        warm(eng, d, "pod-rp")
        prompts = [tokens_for(50 + i, 2 * BS) for i in range(8)]
        base = r.seq
        r.drop = {base + 2, base + 3, base + 6}
        for p in prompts:
            r.request(p)
            seq = r.publish()
        p = wait_pod(d, "pod-rp", seq=seq, state="synced")
        assert p["gaps"] >= 1 and p["replays"] >= 1
        assert p["blocks"] == 16
        for pr in prompts:
            assert matched(d, pr, "pod-rp") == 2
        assert r.replay_requests >= 1
        assert metric(d, "events_replays_total", 'result="ok"') >= 1
        # Never applied twice: a duplicate block store would be counted here.
        assert metric(d, "events_blocks_duplicate_total") == 0


def test_loss_after_replay_served_replays_again(daemon_factory):
    """Batches lost on the live socket after the engine served a replay, before its end
    marker arrived: the buffered batch beyond the gap starts a second replay (not unsynced)."""
    with Engine(pod="pod-r2", model=MODEL, mode="bind", replay=True, block_size=BS) as eng:
        r = eng.rank(0)
        d = start(daemon_factory, {"bind": None,
                                   "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                r.replay_endpoint)})
        warm(eng, d, "pod-r2")
        gate = threading.Event()
        r.replay_end_gate = gate
        prompts = [tokens_for(300 + i, 2 * BS) for i in range(5)]
        base = r.seq
        r.drop = {base + 1, base + 3}
        for p in prompts[:3]:  # base, (base+1 lost), base+2: a gap, replay from base+1
            r.request(p)
            r.publish()
        assert r.replay_served.wait(WAIT), "no replay request reached the engine"
        buffered = metric(d, "events_buffered_batches_total") or 0
        for p in prompts[3:]:  # (base+3 lost), base+4: buffered behind the running replay
            r.request(p)
            seq = r.publish()
        deadline = time.monotonic() + WAIT
        while (metric(d, "events_buffered_batches_total") or 0) < buffered + 1:
            assert time.monotonic() < deadline, "base+4 was never buffered"
            time.sleep(0.02)
        r.replay_end_gate = None
        gate.set()
        p = wait_pod(d, "pod-r2", seq=seq, state="synced")
        assert p["replays"] >= 2 and p["gaps"] >= 2, p
        assert r.replay_requests >= 2
        assert p["blocks"] == 10
        for pr in prompts:
            assert matched(d, pr, "pod-r2") == 2
        assert metric(d, "events_blocks_duplicate_total") == 0


def test_replay_hole_unsynced(daemon_factory):
    with Engine(pod="pod-h", model=MODEL, mode="bind", replay=True, block_size=BS) as eng:
        r = eng.rank(0)
        d = start(daemon_factory, {"bind": None,
                                   "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                r.replay_endpoint)})
        warm(eng, d, "pod-h")
        lost = r.seq + 1
        r.drop = {lost}
        r.skip_replay = {lost}  # the engine's ring no longer has it
        for i in range(3):
            r.request(tokens_for(60 + i, BS))
            seq = r.publish()
        p = wait_pod(d, "pod-h", seq=seq, state="unsynced")
        assert p["blocks"] == 2
        assert metric(d, "events_replays_total", 'result="failed"') >= 1


def test_runtime_endpoints_and_disconnect_purge(daemon_factory):
    d = start(daemon_factory, {"purge_after_disconnect": "300ms"})
    eng = Engine(pod="pod-e", model=MODEL, mode="bind", replay=True, block_size=BS)
    try:
        r = eng.rank(0)
        body = {"endpoint": r.pub_endpoint, "replay_endpoint": r.replay_endpoint}
        status, res = d.json("POST", "/v1/endpoints", body, admin=True)
        assert status in (200, 201), res
        status, res = d.json("POST", "/v1/endpoints", body, admin=True)
        assert status == 409, res
        status, res = d.json("POST", "/v1/endpoints", {"endpoint": "nonsense"}, admin=True)
        assert status == 400, res
        warm(eng, d, "pod-e")
        deadline = time.monotonic() + WAIT
        while True:
            status, res = d.json("GET", "/v1/endpoints", admin=True)
            assert status == 200
            eps = [e for e in res["endpoints"] if e["endpoint"] == r.pub_endpoint]
            if eps and eps[0].get("connected"):
                break
            assert time.monotonic() < deadline, res
            time.sleep(0.02)
        prompt = tokens_for(70, 3 * BS)
        r.request(prompt)
        seq = r.publish()
        wait_pod(d, "pod-e", seq=seq)
        assert matched(d, prompt, "pod-e") == 3
    finally:
        eng.close()  # the engine goes away: purged after 300 ms
    wait_pod(d, "pod-e", pred=lambda p: p["blocks"] == 0)
    assert matched(d, prompt, "pod-e") == 0
    assert metric(d, "events_disconnect_purges_total") >= 1
    status, res = d.json("DELETE", "/v1/endpoints", {"endpoint": r.pub_endpoint}, admin=True)
    assert status in (200, 204), res
    status, res = d.json("DELETE", "/v1/endpoints", {"endpoint": r.pub_endpoint}, admin=True)
    assert status == 404, res


def test_pod_override_empty_topic(daemon_factory):
    with Engine(pod="ignored", model=MODEL, topic="", mode="bind", block_size=BS) as eng:
        r = eng.rank(0)
        d = start(daemon_factory, {"bind": None,
                                   "connect": "%s pod=engine-7@%s" % (r.pub_endpoint, MODEL)})
        warm(eng, d, "engine-7")
        prompt = tokens_for(80, 2 * BS)
        r.request(prompt)
        seq = r.publish()
        wait_pod(d, "engine-7", seq=seq)
        assert matched(d, prompt, "engine-7") == 2


def test_admin_purge_pod(daemon_factory):
    d = start(daemon_factory)
    with Engine(pod="pod-p", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        warm(eng, d, "pod-p")
        r = eng.rank(0)
        prompt = tokens_for(90, 3 * BS)
        r.request(prompt)
        seq = r.publish()
        wait_pod(d, "pod-p", seq=seq)
        status, res = d.json("DELETE", "/v1/pods/pod-p", admin=True)
        assert status in (200, 204), res
        assert matched(d, prompt, "pod-p") == 0
        status, res = d.json("DELETE", "/v1/pods/never-seen", admin=True)
        assert status == 404, res


def test_bad_frames_counted(daemon_factory):
    d = start(daemon_factory)
    with Engine(pod="pod-bad", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        warm(eng, d, "pod-bad")
        r = eng.rank(0)
        r.send_frames([b"kv@pod-bad@" + MODEL.encode(), b"\x00" * 8])
        r.send_frames([b"kv@pod-bad@" + MODEL.encode(), b"\x00" * 4, b"\x90"])
        r.send_frames([b"kv@no-model", b"\x00" * 8, b"\x90"])
        r.raw_event(42)  # not an event: skipped, the rest of the batch applies
        r.request(tokens_for(95, 2 * BS))
        seq = r.publish()
        p = wait_pod(d, "pod-bad", seq=seq)
        assert p["blocks"] == 2
        assert metric(d, "events_bad_frames_total", 'reason="frames"') == 1
        assert metric(d, "events_bad_frames_total", 'reason="seq"') == 1
        assert metric(d, "events_bad_frames_total", 'reason="topic"') == 1
        assert metric(d, "events_skipped_total", 'reason="not_event"') == 1
        assert re.search(r"dropped message .*bad frames", d.stderr_text())
