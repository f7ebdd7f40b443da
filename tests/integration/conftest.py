"""pytest fixtures for kvrouterd integration tests (the Daemon class is in kvrharness.py).

    def test_x(daemon_factory):
        d = daemon_factory({"events": {"bind": ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]}})
        status, body = d.json("GET", "/healthz")

    def test_y(daemon):          # daemon_factory() with the harness defaults
        ...

Besides the contract arguments (config, extra_env, check_exit) the factory accepts
config_text= (write this exact INI text instead of rendering `config`) and args= (extra
command-line arguments). A daemon that does not become ready raises DaemonError with its
stderr; it is killed and not counted for teardown.

Teardown stops every daemon with SIGTERM and fails the test when the exit status is not 0
(for daemons started with check_exit=True) or stderr contains a sanitizer report.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvrharness import Daemon, kvr_bin  # noqa: E402


@pytest.fixture
def daemon_factory():
    started = []

    def factory(config=None, extra_env=None, check_exit=True, **kw):
        d = Daemon(config=config, extra_env=extra_env, check_exit=check_exit, **kw)
        started.append(d)
        return d

    if not os.access(kvr_bin(), os.X_OK):
        pytest.fail("kvrouterd binary not found at %s (run make, or set KVR_BIN)" % kvr_bin())
    yield factory
    problems = []
    for d in started:
        problems += d.finish()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()
