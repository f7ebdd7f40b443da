"""Forward-compatible batches and the engine's publisher id (issue #26), end to end: hand-built
frames from a vllm_pub engine over real ZeroMQ into the real kvrouterd.

vLLM's state-snapshot work (PR #57789, open) gives every publisher lifetime a random 16-byte
id and appends it to the seq frame (8-byte seq + 16 bytes); a later revision may carry it as a
4th batch element instead. Both must be applied, and a changed id on a stream is an engine
restart (blocks purged, counted, logged once) even when the new run's seq did not go
backwards. A batch without an id never flaps the stream. Snapshots keep the id, so a restarted
kvrouterd does not read the run it knew as a restart.
"""

import os
import struct
import time

import msgpack

from test_ingest import MODEL, BS, start, wait_pod, matched, metric, pod_entry
from vllm_pub import Engine, tokens_for

ID_A = bytes.fromhex("8f120344556677889900aabbccddeeff")
ID_B = bytes.fromhex("00112233445566778899aabbccddeef0")


def stored(r, tokens):
    """The BlockStored events of a whole prompt (as the engine's prefix cache chains it)."""
    r.pending = []
    r.request(tokens)
    ev, r.pending = r.pending, []
    return ev


def send(r, seq, events, pub_id=None, carrier="seq_frame", extra=()):
    """One live message with the publisher id in the seq frame or as the 4th batch element;
    `extra` adds further trailing batch elements."""
    body = [time.time(), events, r.rank]
    seq_frame = struct.pack(">Q", seq)
    if pub_id is not None and carrier == "seq_frame":
        seq_frame += pub_id
    elif pub_id is not None:
        body.append(pub_id)
    elif extra:
        body.append(None)
    body.extend(extra)
    r.send_frames([r.engine.topic_bytes, seq_frame, msgpack.packb(body, use_bin_type=True)])


def first(eng, d, pod, pub_id, carrier):
    """Slow joiner: the XPUB saw the subscription; then seq 0 (empty) makes the stream known
    (resending it would read as a restart)."""
    eng.wait_subscriber()
    r = eng.rank(0)
    send(r, 0, [], pub_id, carrier)
    wait_pod(d, pod, seq=0)
    return r


def test_extra_trailing_fields_applied(daemon_factory):
    """A 4th (the id, or nil) and further batch elements are applied like a 3-element batch,
    and do not read as a restart."""
    d = start(daemon_factory)
    with Engine(pod="pod-x", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        r = first(eng, d, "pod-x", None, "batch")
        p1, p2, p3 = tokens_for(1, 3 * BS), tokens_for(2, 2 * BS), tokens_for(3, 4 * BS)
        send(r, 1, stored(r, p1), ID_A, "batch")                    # [ts, events, rank, bin]
        send(r, 2, stored(r, p2), ID_A, "batch", extra=({"snapshot_seq": 7},))  # + a map
        send(r, 3, stored(r, p3), None, "batch", extra=(ID_A, [1, 2], "future"))
        wait_pod(d, "pod-x", seq=3, state="synced")
        assert matched(d, p1, "pod-x") == 3
        assert matched(d, p2, "pod-x") == 2
        assert matched(d, p3, "pod-x") == 4
        assert pod_entry(d, "pod-x")["restarts"] == 0
        assert metric(d, "events_bad_batches_total", 'reason="decode"') == 0


def _restart_case(daemon_factory, carrier):
    d = start(daemon_factory)
    with Engine(pod="pod-r", model=MODEL, mode="connect", endpoints=d.events,
                block_size=BS) as eng:
        r = first(eng, d, "pod-r", ID_A, carrier)
        old = tokens_for(20, 5 * BS)
        send(r, 1, stored(r, old), ID_A, carrier)
        send(r, 2, [], None, carrier)        # no id (an engine without it): same run
        send(r, 3, [], ID_A, carrier)        # the id again: still the same run, no flap
        p = wait_pod(d, "pod-r", seq=3)
        assert p["restarts"] == 0 and p["state"] == "synced", p
        assert matched(d, old, "pod-r") == 5

        # A new engine run whose seq is already past ours (kvrouterd missed its first
        # batches): by seq alone a gap; by its id a restart.
        r.cache.reset()
        new = tokens_for(21, 2 * BS)
        send(r, 7, stored(r, new), ID_B, carrier)
        p = wait_pod(d, "pod-r", seq=7, pred=lambda e: e["restarts"] == 1)
        assert matched(d, old, "pod-r") == 0          # the dead run's blocks are gone
        assert matched(d, new, "pod-r") == 2
        assert p["blocks"] == 2, p
        assert metric(d, "events_publisher_restarts_total") == 1
        assert metric(d, "events_restarts_total") == 1
        send(r, 8, [], None, carrier)
        send(r, 9, [], ID_B, carrier)
        p = wait_pod(d, "pod-r", seq=9)
        assert p["restarts"] == 1, p
        assert metric(d, "events_publisher_restarts_total") == 1
        lines = [ln for ln in d.stderr_text().splitlines() if "restarted (publisher id" in ln]
        assert len(lines) == 1, lines


def test_publisher_id_change_in_seq_frame_is_restart(daemon_factory):
    _restart_case(daemon_factory, "seq_frame")


def test_publisher_id_change_in_batch_is_restart(daemon_factory):
    _restart_case(daemon_factory, "batch")


def test_snapshot_keeps_publisher_id(daemon_factory, tmp_path):
    """SIGTERM with [state] dir, restart: the same run continues (no restart read), a new id
    is a restart."""
    state = str(tmp_path / "state")
    os.mkdir(state)
    conf = {"state": {"dir": state, "snapshot_interval": "0"}}
    d1 = daemon_factory(conf)
    with Engine(pod="pod-s", model=MODEL, mode="connect", endpoints=d1.events,
                block_size=BS) as eng:
        r = first(eng, d1, "pod-s", ID_A, "seq_frame")
        kept = tokens_for(30, 3 * BS)
        send(r, 1, stored(r, kept), ID_A)
        wait_pod(d1, "pod-s", seq=1)
    assert d1.stop() == 0
    assert "snapshot written" in d1.stderr_text()

    d2 = daemon_factory(conf)
    assert "snapshot loaded from" in d2.stderr_text()
    with Engine(pod="pod-s", model=MODEL, mode="connect", endpoints=d2.events,
                block_size=BS) as eng:
        eng.wait_subscriber()
        r = eng.rank(0)
        assert pod_entry(d2, "pod-s")["state"] == "restored"
        send(r, 2, [], ID_A)             # seq 2 of the same run: applied, not a restart
        p = wait_pod(d2, "pod-s", seq=2)
        assert p["restarts"] == 0 and p["state"] == "synced", p
        assert matched(d2, kept, "pod-s") == 3
        # a new run at seq 3: only the id tells
        send(r, 3, [], ID_B)
        p = wait_pod(d2, "pod-s", seq=3, pred=lambda e: e["restarts"] == 1)
        assert matched(d2, kept, "pod-s") == 0
        assert metric(d2, "events_publisher_restarts_total") == 1
