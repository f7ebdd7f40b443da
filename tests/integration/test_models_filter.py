"""[events] models (issue #26): an instance that holds only some models, end to end through
real ZeroMQ and the real binary. Events of other models are skipped by the subscriber before
any writer sees them (the skip counter moves, the writers' applied-batch counter does not, the
index stays empty for them); queries naming them answer 404 with a JSON error; without the
directive every model is served as before; SIGHUP changes the list.
"""

import time

from kvrharness import merge_config, render_config
from test_ingest import BS, metric, pod_entry, wait_pod, warm
from vllm_pub import Engine, tokens_for

HELD = "test/llama"
OTHER = "blocked/model-b"


def skipped(d):
    return metric(d, "events_messages_skipped_total", 'reason="model"')


def wait_metric(d, name, labels, want, timeout=10):
    deadline = time.monotonic() + timeout
    v = None
    while time.monotonic() < deadline:
        v = metric(d, name, labels)
        if v == want:
            return v
        time.sleep(0.02)
    raise AssertionError("%s{%s} = %r, want %r" % (name, labels, v, want))


def query(d, path, model, **kw):
    body = {"model": model}
    body.update(kw)
    return d.json("POST", path, body)


def test_filtered_model_never_reaches_a_writer(daemon_factory):
    d = daemon_factory({"events": {"models": "test/* other/exact"}})
    prompt = tokens_for(5, 4 * BS)
    with Engine(pod="pod-a", model=HELD, mode="connect", endpoints=d.events,
                block_size=BS) as held, \
            Engine(pod="pod-b", model=OTHER, mode="connect", endpoints=d.events,
                   block_size=BS) as other:
        warm(held, d, "pod-a")
        r = held.rank(0)
        r.request(prompt)
        seq = r.publish()
        wait_pod(d, "pod-a", seq=seq, state="synced")
        batches = metric(d, "events_batches_total")
        messages = metric(d, "events_messages_total")
        assert batches == 2 and skipped(d) == 0

        # the other model's engine publishes: every message is skipped at the subscriber
        other.wait_subscriber()
        o = other.rank(0)
        o.request(prompt)
        for _ in range(5):
            o.publish()
        wait_metric(d, "events_messages_skipped_total", 'reason="model"', 5)
        assert metric(d, "events_batches_total") == batches   # no writer applied anything
        assert metric(d, "events_messages_total") == messages  # nothing was queued
        assert metric(d, "events_bad_frames_total", 'reason="topic"') == 0
        assert pod_entry(d, "pod-b") is None                    # no stream, no worker
        status, body = d.json("GET", "/v1/pods", admin=True)
        assert [p["pod"] for p in body["pods"]] == ["pod-a"]

        # queries: the held model is answered, the other one is a 404 naming it
        status, body = query(d, "/v1/score", HELD, token_ids=prompt)
        assert status == 200 and body["scores"][0]["matched_blocks"] == 4, body
        for path in ("/v1/score", "/v1/route", "/v1/tokenize"):
            kw = {"prompt": "hi"} if path == "/v1/tokenize" else {"token_ids": prompt}
            status, body = query(d, path, OTHER, **kw)
            assert status == 404, (path, status, body)
            msg = body["error"] if isinstance(body.get("error"), str) else str(body)
            assert OTHER in msg and "[events] models" in msg and "test/* other/exact" in msg, body
        status, body = query(d, "/v1/score", "other/exact", token_ids=prompt)
        assert status == 200, body  # held (nothing indexed for it yet)

        # SIGHUP: the list now holds the other model; its next batches are applied
        conf = merge_config(d.config)
        conf["events"]["models"] = "test/* blocked/*"
        with open(d.conf_path, "w") as f:
            f.write(render_config(conf))
        m = d.reload()
        assert m.group(0).startswith("reload ok: changed events.models"), m.group(0)
        o.request(tokens_for(6, 2 * BS))
        seq = o.publish()
        p = wait_pod(d, "pod-b", seq=seq)
        assert p["model"] == OTHER
        status, body = query(d, "/v1/score", OTHER, token_ids=prompt)
        assert status == 200, body
        assert skipped(d) == 5
        # and the first model is dropped: its events are skipped from now on
        conf["events"]["models"] = "blocked/*"
        with open(d.conf_path, "w") as f:
            f.write(render_config(conf))
        assert d.reload().group(0).startswith("reload ok: changed events.models")
        before = metric(d, "events_batches_total")
        r.publish()
        wait_metric(d, "events_messages_skipped_total", 'reason="model"', 6)
        assert metric(d, "events_batches_total") == before
        status, body = query(d, "/v1/score", HELD, token_ids=prompt)
        assert status == 404, body


def test_no_filter_serves_every_model(daemon_factory):
    d = daemon_factory()
    with Engine(pod="pod-b", model=OTHER, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        seq = warm(eng, d, "pod-b")
        assert seq == 0
    for model in (HELD, OTHER, "anything/else"):
        status, body = query(d, "/v1/score", model, token_ids=tokens_for(1, BS))
        assert status == 200, body
    assert skipped(d) == 0


def test_bad_pattern_rejected(daemon_factory, tmp_path):
    from kvrharness import run_kvr
    conf = tmp_path / "k.conf"
    conf.write_text(render_config(merge_config({"events": {"models": "ok/* bad[0-9"}})))
    r = run_kvr(["-t", "-c", str(conf)])
    assert r.returncode == 1
    assert "[events] models: pattern 'bad[0-9': '[' set without its ']'" in r.stderr, r.stderr
