"""Process lifecycle of kvrouterd: argv, -t, ready line, signals, reload, systemd notify."""

import os
import re
import signal
import socket
import tempfile
import time

import pytest

from kvrharness import REPO, Daemon, merge_config, render_config, run_kvr

VERSION = open(os.path.join(REPO, "VERSION")).read().strip()


def write_conf(tmp_path, text, name="k.conf"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_ready_line_and_clean_stop(daemon):
    assert daemon.ready["version"] == VERSION
    line = daemon.wait_log(r"^.*kvrouterd ready.*$").group(0)
    assert " info " in line or '"level":"info"' in line
    assert daemon.stop() == 0
    assert re.search(r"kvrouterd stopped", daemon.stderr_text())


def test_sigint_stops_cleanly(daemon):
    daemon.signal(signal.SIGINT)
    assert daemon.stop(timeout=10) == 0
    assert "received SIGINT" in daemon.stderr_text()


def test_sigterm_exits_zero_quickly(daemon):
    t0 = time.monotonic()
    assert daemon.stop(timeout=10) == 0
    # Reported, not asserted: timing is noisy on shared machines.
    print("SIGTERM to exit: %.3f s" % (time.monotonic() - t0))


def test_check_config_ok(tmp_path):
    path = write_conf(tmp_path, render_config(merge_config()))
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stderr


def test_check_shipped_config(tmp_path):
    # [state] dir is the systemd unit's /var/lib/kvrouterd: checked here with it pointed at a
    # temporary directory (the shipped file as it is: test_check_shipped_config_as_is)
    text = open(os.path.join(REPO, "conf", "kvrouterd.conf")).read()
    assert "\ndir = /var/lib/kvrouterd\n" in text
    path = tmp_path / "kvrouterd.conf"
    path.write_text(text.replace("\ndir = /var/lib/kvrouterd\n", "\ndir = %s\n" % tmp_path))
    r = run_kvr(["-t", "-c", str(path)])
    assert r.returncode == 0, r.stderr


def test_check_shipped_config_as_is():
    # A fresh checkout on a machine without /var/lib/kvrouterd: -t accepts the shipped file,
    # says the directory will be made at start, and changes nothing on disk.
    state = "/var/lib/kvrouterd"
    existed = os.path.isdir(state)
    r = run_kvr(["-t", "-c", os.path.join(REPO, "conf", "kvrouterd.conf")])
    if not existed and not os.access("/var/lib", os.W_OK | os.X_OK):
        assert r.returncode == 1
        assert "[state] dir: state directory /var/lib/kvrouterd is missing and cannot be " \
               "created: /var/lib is not writable" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert "is valid" in r.stderr
    if not existed:
        assert "does not exist yet; kvrouterd creates it (mode 0750)" in r.stderr
        assert not os.path.exists(state)


def test_missing_state_dir_is_created_at_start(tmp_path):
    state = tmp_path / "var" / "lib" / "kvrouterd"
    state.parent.mkdir(parents=True)
    conf = render_config(merge_config({"state": {"dir": str(state)}}))
    path = write_conf(tmp_path, conf)
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 0, r.stderr
    assert "%s:" % path in r.stderr and "does not exist yet" in r.stderr
    assert not state.exists()
    old = os.umask(0o022)
    try:
        d = Daemon(config_text=conf, tmpdir=str(tmp_path))
    finally:
        os.umask(old)
    try:
        assert state.is_dir()
        assert (state.stat().st_mode & 0o777) == 0o750
        d.wait_log(r"created state directory %s" % re.escape(str(state)))
    finally:
        assert d.stop() == 0
    # its parent missing too: a clear error at -t and at start, nothing made
    deeper = tmp_path / "nowhere" / "kvrouterd"
    conf2 = render_config(merge_config({"state": {"dir": str(deeper)}}))
    path2 = write_conf(tmp_path, conf2, name="k2.conf")
    for args in (["-t", "-c", path2], ["-c", path2]):
        r = run_kvr(args)
        assert r.returncode == 1
        assert "state directory %s: No such file or directory (nor its parent %s)" \
            % (deeper, deeper.parent) in r.stderr, r.stderr
        if args[0] == "-t":
            assert r.stderr.startswith("%s:" % path2) and "[state] dir:" in r.stderr
    assert not deeper.parent.exists()


@pytest.mark.parametrize("text,line,msg", [
    ("[log]\nlevel = info\nbogus = 1\n", 3, "unknown key 'bogus' in section [log]"),
    ("[log]\nlevel = loud\n", 2,
     "invalid value 'loud' for [log] level: expected error, warn, info or debug"),
    ("[events]\nbind = tcp://127.0.0.1:*\nwriter_threads = 65\n", 3,
     "[events] writer_threads = 65 is out of range (1..64)"),
    ("[nope]\n", 1, "unknown section [nope] (expected one of [log], [events], [index], [http], "
     "[score], [route], [load], [tokenizer], [state], [daemon], [model \"NAME\"])"),
])
def test_check_config_fails_with_file_line(tmp_path, text, line, msg):
    path = write_conf(tmp_path, text)
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 1
    assert r.stderr == "%s:%d: %s\n" % (path, line, msg)


def test_check_missing_file(tmp_path):
    path = str(tmp_path / "absent.conf")
    r = run_kvr(["-t", "-c", path])
    assert r.returncode == 1
    assert r.stderr.startswith(path + ": cannot open")


def test_start_with_bad_config_exits_1(tmp_path):
    path = write_conf(tmp_path, "[http]\nlisten = nowhere\n")
    r = run_kvr(["-c", path])
    assert r.returncode == 1
    assert "%s:2: invalid value 'nowhere' for [http] listen" % path in r.stderr


def test_version():
    r = run_kvr(["--version"])
    assert r.returncode == 0
    assert r.stdout.startswith("kvrouterd %s" % VERSION)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag):
    r = run_kvr([flag])
    assert r.returncode == 0
    assert "Usage: kvrouterd" in r.stdout and "-t" in r.stdout


@pytest.mark.parametrize("args", [["-x"], ["--bogus"], ["-c"], ["extra-arg"]])
def test_bad_usage_exits_2(args):
    r = run_kvr(args)
    assert r.returncode == 2
    assert "Usage: kvrouterd" in r.stderr


def test_reload_changes_log_level(daemon_factory):
    d = daemon_factory({"log": {"level": "info"}})
    assert " debug " not in d.stderr_text()
    with open(d.conf_path, "w") as f:
        f.write(render_config(merge_config({"log": {"level": "debug"}})))
    m = d.reload()
    assert m.group(0).startswith("reload ok: changed log.level"), m.group(0)
    d.wait_log(r" debug reload: log level is now debug")

    # A broken file is rejected with FILE:LINE and the previous configuration stays.
    with open(d.conf_path, "w") as f:
        f.write("[log]\nlevel = info\nlevel = warn\n")
    m = d.reload()
    assert m.group(0) == ("reload failed: %s:3: duplicate key 'level' in section [log] "
                          "(first set on line 2) (keeping the previous configuration)"
                          % d.conf_path)
    assert d.running()
    # Still at debug: reloading the debug config again changes nothing.
    with open(d.conf_path, "w") as f:
        f.write(render_config(merge_config({"log": {"level": "debug"}})))
    m = d.reload()
    assert m.group(0) == "reload ok: no changes"

    # Going quieter: the result line is still visible, debug lines stop.
    with open(d.conf_path, "w") as f:
        f.write(render_config(merge_config({"log": {"level": "info"}})))
    mark = d.log_mark()
    m = d.reload()
    assert m.group(0).startswith("reload ok: changed log.level")
    d.stop()
    assert " debug " not in d.stderr_text()[mark:]


def _lines_after(d, m):
    return d.stderr_text()[m.end():].splitlines()[1:]


@pytest.mark.parametrize("new_level", ["debug", "info"])
def test_reload_result_is_the_last_line(daemon_factory, new_level):
    """"reload ok" is the last line a reload writes (the warning about restart-only
    directives and the debug line come before it), so whoever waits for it and then takes a
    log mark sees no line of that reload after the mark (test_reload_changes_log_level was
    flaky because the debug line came after "reload ok")."""
    d = daemon_factory({"log": {"level": "debug"}})
    with open(d.conf_path, "w") as f:
        f.write(render_config(merge_config({"log": {"level": new_level},
                                            "events": {"writer_threads": "3"}})))
    mark = d.log_mark()
    m = d.reload()
    assert m.group(0).startswith("reload ok:"), m.group(0)
    before = d.stderr_text()[mark:m.start()]
    assert "need a restart" in before
    if new_level == "debug":
        assert "reload: log level is now debug" in before
    d.stop()
    after = _lines_after(d, m)
    assert after and "received SIGTERM" in after[0], after


def test_reload_format_weights_and_restart_only(daemon_factory):
    d = daemon_factory({"log": {"level": "info"}})
    with open(d.conf_path, "w") as f:
        f.write(render_config(merge_config({
            "log": {"level": "info", "format": "json"},
            "score": {"weight.cpu": "0.25"},
            "events": {"writer_threads": "3"},
        })))
    m = d.reload()
    assert m.group(0) == "reload ok: changed log.format, score.weight.cpu"
    d.wait_log(r'\{"ts":"[^"]+","level":"warn","msg":"reload: changes to events.writer_threads '
               r'need a restart and were not applied"\}')


def _recv_until(sock, want, timeout=10):
    """Collects datagrams until one contains `want`; returns all received so far."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            break
        got.append(msg)
        if want in msg.split("\n"):
            return got
    raise AssertionError("no %r from kvrouterd within %ss; got %r" % (want, timeout, got))


@pytest.mark.parametrize("abstract", [False, True])
def test_systemd_notify(daemon_factory, abstract):
    tmp = tempfile.mkdtemp(prefix="kvr-notify-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = "kvr-test-%d-%d" % (os.getpid(), time.monotonic_ns())
        sock.bind("\0" + name)
        env_sock = "@" + name
    else:
        env_sock = os.path.join(tmp, "notify.sock")
        sock.bind(env_sock)
    try:
        d = daemon_factory(extra_env={"NOTIFY_SOCKET": env_sock, "WATCHDOG_USEC": "200000"})
        got = _recv_until(sock, "READY=1")
        assert any("STATUS=" in g for g in got)
        _recv_until(sock, "WATCHDOG=1")
        d.reload()
        got = _recv_until(sock, "RELOADING=1")
        assert re.search(r"^MONOTONIC_USEC=\d+$", got[-1], re.M), got[-1]
        _recv_until(sock, "READY=1")
        assert d.stop() == 0
        _recv_until(sock, "STOPPING=1")
    finally:
        sock.close()
        if not abstract:
            os.unlink(env_sock)
        os.rmdir(tmp)


def test_watchdog_for_other_pid_is_ignored(daemon_factory):
    tmp = tempfile.mkdtemp(prefix="kvr-notify-")
    path = os.path.join(tmp, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        d = daemon_factory(extra_env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000",
                                      "WATCHDOG_PID": "1"})
        _recv_until(sock, "READY=1")
        assert d.stop() == 0
        got = _recv_until(sock, "STOPPING=1")
        assert not any("WATCHDOG=1" in g for g in got), got
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(tmp)
