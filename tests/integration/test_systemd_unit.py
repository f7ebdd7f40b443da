"""systemd/kvrouterd.service: `systemd-analyze verify` passes and the offline security
exposure stays <= 2.0. Skipped where systemd-analyze is not installed (e.g. containers)."""

import os
import re
import shutil
import subprocess

import pytest

from kvrharness import REPO, kvr_bin

ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


@pytest.fixture
def installed_unit(tmp_path):
    """The unit as `make install` writes it, with the paths pointing into tmp_path."""
    bindir = tmp_path / "bin"
    sysconfdir = tmp_path / "etc"
    bindir.mkdir()
    (sysconfdir / "kvrouterd").mkdir(parents=True)
    shutil.copy(kvr_bin(), bindir / "kvrouterd")
    shutil.copy(os.path.join(REPO, "conf", "kvrouterd.conf"), sysconfdir / "kvrouterd")
    text = open(os.path.join(REPO, "systemd", "kvrouterd.service")).read()
    assert "@BINDIR@" in text and "@SYSCONFDIR@" in text
    text = text.replace("@BINDIR@", str(bindir)).replace("@SYSCONFDIR@", str(sysconfdir))
    unit = tmp_path / "kvrouterd.service"
    unit.write_text(text)
    return str(unit)


def test_unit_verifies(installed_unit):
    r = subprocess.run([ANALYZE, "verify", installed_unit], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # Warnings about our unit (not about the host's other units) count as failures.
    ours = [l for l in r.stderr.splitlines() if l.startswith("kvrouterd.service")]
    assert ours == [], r.stderr


def test_unit_security_exposure(installed_unit):
    r = subprocess.run([ANALYZE, "security", "--offline=yes", installed_unit],
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    m = re.search(r"Overall exposure level for kvrouterd\.service: (\d+\.\d+)", out)
    assert m, out
    print("systemd-analyze security exposure: %s" % m.group(1))
    assert float(m.group(1)) <= 2.0, out


def test_unit_contract(installed_unit):
    text = open(installed_unit).read()
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "DynamicUser=yes",
                 "WatchdogSec=", "Restart=on-failure", "CapabilityBoundingSet=\n"):
        assert line in text, line
    assert re.search(r"^ExecStartPre=\S+/kvrouterd -t -c \S+/kvrouterd\.conf$", text, re.M)
