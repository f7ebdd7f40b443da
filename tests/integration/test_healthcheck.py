"""scripts/healthcheck.sh (the image's HEALTHCHECK, kvrouterd-healthcheck): probes GET
/healthz on the port of [http] listen read from the configuration file, so a mounted
configuration with another port is followed. The container itself: make docker-test."""

import os
import shutil
import subprocess

import pytest

from kvrharness import REPO
from kvrharness import free_port

SCRIPT = os.path.join(REPO, "scripts", "healthcheck.sh")
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None or shutil.which("timeout") is None,
                                reason="bash/timeout not installed")


def probe(conf_text, tmp_path, env=None):
    conf = tmp_path / "probe.conf"
    conf.write_text(conf_text)
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([BASH, SCRIPT, str(conf)], capture_output=True, text=True,
                          timeout=20, env=e)


def test_follows_configured_port(daemon, tmp_path):
    port = daemon.http_port
    # the shapes inih accepts: spaces, ':' separator, inline ' ;' comment, other sections
    # with a listen key, the last assignment winning
    text = ("[events]\nlisten = 127.0.0.1:1\n"
            "[http]\n; listen = 127.0.0.1:2\n# comment\nlisten = 127.0.0.1:3\n"
            "  listen:127.0.0.1:%d   ; the scoring API\nadmin_listen = 127.0.0.1:4\n"
            "[score]\nlisten = 127.0.0.1:5\n" % port)
    r = probe(text, tmp_path)
    assert r.returncode == 0, r.stderr
    # 0.0.0.0 is probed on loopback
    r = probe("[http]\nlisten = 0.0.0.0:%d\n" % port, tmp_path)
    assert r.returncode == 0, r.stderr


def test_fails_on_other_port_and_port_zero(daemon, tmp_path):
    r = probe("[http]\nlisten = 127.0.0.1:%d\n" % free_port(), tmp_path)
    assert r.returncode == 1 and "failed" in r.stderr, r.stderr
    r = probe("[http]\nlisten = 127.0.0.1:0\n", tmp_path)
    assert r.returncode == 1 and "port 0" in r.stderr, r.stderr
    r = probe("[http]\nlisten = nonsense\n", tmp_path)
    assert r.returncode == 1 and "cannot parse" in r.stderr, r.stderr


def test_default_port_when_not_set(tmp_path):
    # no [http] listen: the daemon's default 0.0.0.0:8080 is probed
    r = probe("[log]\nlevel = info\n", tmp_path, env={"KVR_HEALTHCHECK_TIMEOUT": "1"})
    listening = subprocess.run(["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080"],
                               capture_output=True).returncode == 0
    if listening:
        pytest.skip("something listens on 8080 here")
    assert r.returncode == 1 and "127.0.0.1:8080" in r.stderr, r.stderr
