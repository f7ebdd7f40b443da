"""Event-plane admission end to end (docs/security.md): the real kvrouterd, real ZeroMQ over
loopback, vllm_pub engines as publishers.

A second loopback source address comes from libzmq's "tcp://SOURCE:0;HOST:PORT" connect
syntax: an engine dialing from 127.0.0.2 is a different peer from one dialing from
127.0.0.1 (all of 127/8 is loopback on Linux). Every wait is bounded.
"""

import re
import time

import pytest
import zmq

from kvrharness import merge_config, render_config, run_kvr
from test_ingest import MODEL, matched, metric, need_http, wait_pod, warm
from vllm_pub import Engine, be64, tokens_for

BS = 16
WAIT = 10.0


def start(daemon_factory, events):
    d = daemon_factory({"events": events})
    need_http(d)
    return d


def from_source(src, endpoints):
    """The daemon's endpoints, dialed from source address src."""
    return ["tcp://%s:0;%s" % (src, ep[len("tcp://"):]) for ep in endpoints]


def rejected(d, reason):
    return metric(d, "events_rejected_total", 'reason="%s"' % reason) or 0


def wait_metric(d, name, want, labels=None, timeout=WAIT):
    deadline = time.monotonic() + timeout
    v = None
    while time.monotonic() < deadline:
        v = metric(d, name, labels)
        if v is not None and v >= want:
            return v
        time.sleep(0.02)
    raise AssertionError("%s{%s} stayed at %r (< %r); stderr tail:\n%s"
                         % (name, labels, v, want, d.stderr_text()[-3000:]))


def wait_pod_quick(d, pod, seq, timeout=0.2):
    try:
        wait_pod(d, pod, seq=seq, timeout=timeout)
        return True
    except AssertionError:
        return False


def pod_names(d):
    status, body = d.json("GET", "/v1/pods", admin=True)
    assert status == 200, body
    return {p["pod"] for p in body["pods"]}


# ---- address allowlist (ZAP) ------------------------------------------------------------

def test_allowlist_refuses_address_and_never_touches_index(daemon_factory):
    d = start(daemon_factory, {"allow": ["127.0.0.2/32", "::1/128"]})
    ok_prompt, bad_prompt = tokens_for(31, 6 * BS), tokens_for(32, 6 * BS)
    with Engine(pod="pod-in", model=MODEL, endpoints=from_source("127.0.0.2", d.events),
                block_size=BS) as good, \
            Engine(pod="pod-out", model=MODEL, endpoints=d.events, block_size=BS) as bad:
        # The refused engine (from 127.0.0.1) keeps trying: wait for the refusal first.
        wait_metric(d, "events_rejected_total", 1, 'reason="address"')
        for _ in range(5):
            bad.rank(0).request(bad_prompt)
            bad.rank(0).publish()
            time.sleep(0.02)
        warm(good, d, "pod-in")
        good.rank(0).request(ok_prompt)
        seq = good.rank(0).publish()
        wait_pod(d, "pod-in", seq=seq, state="synced")
        assert matched(d, ok_prompt, "pod-in") == 6
        # The refused engine's batches never arrived: no stream, no blocks.
        assert "pod-out" not in pod_names(d)
        assert matched(d, bad_prompt, "pod-out") == 0
    assert rejected(d, "address") >= 1
    assert rejected(d, "pod_mismatch") == 0
    d.wait_log(r"events: refused 127\.0\.0\.1: address \(not in \[events\] allow\)")


def test_allowlist_ipv6(daemon_factory):
    d = daemon_factory({"events": {"bind": "tcp://[::1]:*", "allow": "::1/128"}})
    need_http(d)
    with Engine(pod="pod-v6", model=MODEL, endpoints=d.events, block_size=BS,
                pub_options={zmq.IPV6: 1}) as eng:
        warm(eng, d, "pod-v6")
    assert rejected(d, "address") == 0


def test_connect_endpoints_not_subject_to_admission(daemon_factory):
    """We dial the engine (and its replay ROUTER): the allowlist and the pod check are for
    bind sockets (docs/security.md), so an engine at a non-allowed address with a pod id
    that is not its address still works, replay included."""
    with Engine(pod="pod-dialed", model=MODEL, mode="bind", replay=True, block_size=BS) as eng:
        r = eng.rank(0)
        d = start(daemon_factory, {"allow": "10.0.0.0/8", "pod_must_match_peer": "on",
                                   "connect": "%s replay=%s" % (r.pub_endpoint,
                                                                r.replay_endpoint)})
        warm(eng, d, "pod-dialed")
        base = r.seq
        r.drop = {base + 1}
        for i in range(3):
            r.request(tokens_for(70 + i, 2 * BS))
            seq = r.publish()
        p = wait_pod(d, "pod-dialed", seq=seq, state="synced")
        assert p["replays"] >= 1 and p["blocks"] == 6
    assert rejected(d, "address") == 0 and rejected(d, "pod_mismatch") == 0


# ---- pod must match peer: the spoofing scenario -----------------------------------

def test_spoofed_pod_rejected_victim_unchanged(daemon_factory):
    d = start(daemon_factory, {"pod_must_match_peer": "on"})
    victim_pod = "127.0.0.1"  # llm-d convention: kv@<pod-ip>@<model>
    first = tokens_for(41, 25 * BS)
    injected = tokens_for(42, 8 * BS)
    with Engine(pod=victim_pod, model=MODEL, endpoints=d.events, block_size=BS) as victim, \
            Engine(pod=victim_pod, model=MODEL, endpoints=from_source("127.0.0.2", d.events),
                   block_size=BS) as attacker:
        warm(victim, d, victim_pod)
        v = victim.rank(0)
        v.request(first)
        seq = v.publish()
        p = wait_pod(d, victim_pod, seq=seq, state="synced")
        assert p["blocks"] == 25
        # The attacker (from 127.0.0.2) claims the victim's topic: a seq jump with an empty
        # batch, its own blocks, then AllBlocksCleared.
        attacker.wait_subscriber()
        a = attacker.rank(0)
        a.seq = 10 ** 9
        a.publish()
        a.request(injected)
        a.publish()
        a.clear()
        a.publish()
        wait_metric(d, "events_rejected_total", 3, 'reason="pod_mismatch"')
        # The victim's next real batch is just the next batch: no restart, nothing purged.
        more = tokens_for(43, 4 * BS)
        v.request(more)
        seq = v.publish()
        p = wait_pod(d, victim_pod, seq=seq)
        assert p["state"] == "synced"
        assert p["restarts"] == 0 and p["gaps"] == 0
        assert p["blocks"] == 29
        assert matched(d, first, victim_pod) == 25
        assert matched(d, injected, victim_pod) == 0
    assert metric(d, "events_restarts_total") == 0
    d.wait_log(r"dropped message for pod '127\.0\.0\.1' from 127\.0\.0\.2 .*pod_mismatch")


def test_pod_must_match_peer_skips_ipc(daemon_factory, tmp_path):
    """ipc peers are local processes without an address: the pod check does not apply."""
    d = start(daemon_factory, {"bind": "ipc://%s/ev.sock" % tmp_path,
                               "pod_must_match_peer": "on"})
    with Engine(pod="pod-local", model=MODEL, endpoints=d.events, block_size=BS) as eng:
        warm(eng, d, "pod-local")
    assert rejected(d, "pod_mismatch") == 0


def test_pod_must_match_peer_off_by_default(daemon_factory):
    """Default off: a pod id that is not an address (today's deployments) still works."""
    d = start(daemon_factory, {})
    with Engine(pod="pod-name", model=MODEL, endpoints=d.events, block_size=BS) as eng:
        warm(eng, d, "pod-name")
    assert rejected(d, "pod_mismatch") == 0


# ---- CURVE ---------------------------------------------------------------------------------

def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_curve_accepts_authorized_and_refuses_others(daemon_factory, tmp_path):
    spub, ssec = zmq.curve_keypair()
    c1pub, c1sec = zmq.curve_keypair()
    c2pub, c2sec = zmq.curve_keypair()
    d = start(daemon_factory, {
        "curve_secret_key_file": write(tmp_path / "s.key", "# server\n%s\n" % ssec.decode()),
        "curve_public_key_file": write(tmp_path / "p.key", spub.decode() + "\n"),
        "curve_authorized_keys_file": write(tmp_path / "auth", "# publishers\n%s\n"
                                            % c1pub.decode()),
    })

    def client(pub, sec):
        return {zmq.CURVE_SERVERKEY: spub, zmq.CURVE_PUBLICKEY: pub, zmq.CURVE_SECRETKEY: sec}

    prompt = tokens_for(51, 3 * BS)
    with Engine(pod="pod-c1", model=MODEL, endpoints=d.events, block_size=BS,
                pub_options=client(c1pub, c1sec)) as ok:
        warm(ok, d, "pod-c1")
        ok.rank(0).request(prompt)
        seq = ok.rank(0).publish()
        wait_pod(d, "pod-c1", seq=seq)
        assert matched(d, prompt, "pod-c1") == 3
    with Engine(pod="pod-c2", model=MODEL, endpoints=d.events, block_size=BS,
                pub_options=client(c2pub, c2sec)) as stranger:
        wait_metric(d, "events_rejected_total", 1, 'reason="curve_key"')
        stranger.rank(0).publish()
    with Engine(pod="pod-null", model=MODEL, endpoints=d.events, block_size=BS) as plain:
        wait_metric(d, "events_rejected_total", 1, 'reason="handshake"')
        plain.rank(0).publish()
    time.sleep(0.2)
    assert pod_names(d) == {"pod-c1"}
    d.wait_log(r"events: refused 127\.0\.0\.1: curve_key \(%s\)" % re.escape(c2pub.decode()))


def test_curve_bad_key_files_fail_check_and_start(tmp_path):
    spub, ssec = zmq.curve_keypair()
    opub, _ = zmq.curve_keypair()
    sec = write(tmp_path / "s.key", ssec.decode())
    cases = [
        (write(tmp_path / "wrong.pub", opub.decode()), "not the public key of"),
        (str(tmp_path / "missing.pub"), "cannot open"),
        (write(tmp_path / "junk.pub", "not a key\n"), "expected one Z85 key"),
    ]
    for pub, msg in cases:
        cfg = merge_config({"events": {"curve_secret_key_file": sec,
                                       "curve_public_key_file": pub}})
        path = write(tmp_path / "k.conf", render_config(cfg))
        r = run_kvr(["-t", "-c", path])
        assert r.returncode == 1, r.stderr
        assert msg in r.stderr, r.stderr
        assert r.stderr.startswith(path + ":"), r.stderr
        # Startup refuses it the same way.
        r = run_kvr(["-c", path])
        assert r.returncode == 1 and msg in r.stderr, r.stderr


# ---- oversized messages ---------------------------------------------------------------------

def test_oversized_message_counted_and_logged(daemon_factory):
    d = start(daemon_factory, {"max_message_size": "1KiB", "reconnect_interval": "100ms"})
    with Engine(pod="pod-big", model=MODEL, endpoints=d.events, block_size=BS) as eng:
        warm(eng, d, "pod-big")
        r = eng.rank(0)
        seq = r.seq
        r.seq += 1
        r.send_frames([eng.topic_bytes, be64(seq), b"\x90" * 2048])  # 2 KiB > 1 KiB
        wait_metric(d, "events_connections_dropped_total", 1)
        d.wait_log(r"dropped the connection of publisher 127\.0\.0\.1:\d+ on tcp://127\.0\.0\.1:"
                   r"\d+: it sent a message over max_message_size \(1024 bytes\)")
        # The engine reconnects by itself; later batches arrive again (after a gap). The
        # XPUB reports no new subscription, so publish until one gets through.
        wait_metric(d, "events_publisher_connects_total", 2)
        deadline = time.monotonic() + WAIT
        while True:
            seq = r.publish()
            if wait_pod_quick(d, "pod-big", seq) or time.monotonic() > deadline:
                break
        wait_pod(d, "pod-big", seq=seq)
        # The drop was not taken for a publisher closing its connection.
        assert metric(d, "events_publisher_disconnects_total") == 0
        assert metric(d, "events_connections_dropped_total") == 1


def test_oversized_message_over_ipc(daemon_factory, tmp_path):
    ep = "ipc://%s/ev.sock" % tmp_path
    d = start(daemon_factory, {"bind": ep, "max_message_size": "1KiB"})
    with Engine(pod="pod-ipc", model=MODEL, endpoints=d.events, block_size=BS) as eng:
        warm(eng, d, "pod-ipc")
        r = eng.rank(0)
        r.send_frames([eng.topic_bytes, be64(r.seq), b"\x90" * 4096])
        wait_metric(d, "events_connections_dropped_total", 1)
        d.wait_log(r"dropped the connection of publisher a local process on %s" % re.escape(ep))
        assert metric(d, "events_publisher_disconnects_total") == 0


def test_publisher_close_is_not_a_drop(daemon_factory):
    d = start(daemon_factory, {})
    with Engine(pod="pod-bye", model=MODEL, endpoints=d.events, block_size=BS) as eng:
        warm(eng, d, "pod-bye")
    wait_metric(d, "events_publisher_disconnects_total", 1)
    assert metric(d, "events_publisher_connects_total") >= 1
    assert metric(d, "events_connections_dropped_total") == 0
    d.wait_log(r"events: publisher 127\.0\.0\.1:\d+ disconnected from tcp://127\.0\.0\.1:\d+")


# ---- kvrouterd -t resolves what startup resolves --------------------------------------------

@pytest.mark.parametrize("bind,reason", [
    ("tcp://localhost:5557", "'localhost' is none of these on this host"),
    ("tcp://no-such-if0:5557", "'no-such-if0' is none of these on this host"),
    ("ipc:///nonexistent-dir-kvr/sock", "directory /nonexistent-dir-kvr does not exist"),
])
def test_check_rejects_unbindable_endpoint(tmp_path, bind, reason):
    text = "[log]\nlevel = info\n[events]\nbind = %s\n" % bind
    path = write(tmp_path / "b.conf", text)
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("%s:4: [events] bind %s: " % (path, bind)), r.stderr
    assert reason in r.stderr, r.stderr
    # What startup says about the same file (the check is not stricter than startup).
    r = run_kvr(["-c", path])
    assert r.returncode == 1, r.stderr


def test_check_accepts_bindable_endpoints(tmp_path):
    text = ("[events]\nbind = tcp://127.0.0.1:0\nbind = tcp://*:0\nbind = tcp://lo:0\n"
            "bind = tcp://[::1]:0\nconnect = tcp://no-such-host.invalid:5557\n")
    path = write(tmp_path / "ok.conf", text)
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 0, r.stderr
    # An unresolvable connect host is advice (zmq_connect accepts it and keeps retrying).
    assert "warning: [events] connect tcp://no-such-host.invalid:5557" in r.stderr
