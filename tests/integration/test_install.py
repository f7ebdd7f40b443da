"""`make install` into a DESTDIR: the first install writes the shipped configuration; a
second install keeps the operator's edited file byte for byte and puts the shipped one
beside it as kvrouterd.conf.dist, saying so."""

import os
import shutil
import subprocess

import pytest

from kvrharness import REPO, kvr_bin

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make not installed")


def make_install(destdir):
    # -o all: install the binary under test (INSTALL_BIN) without rebuilding or relinking
    # build/kvrouterd, whatever variant the suite runs.
    # a make of its own, not a sub-make of the `make test` that may be running this suite
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run([MAKE, "--no-print-directory", "-C", REPO, "-o", "all", "install",
                        "DESTDIR=%s" % destdir, "PREFIX=/usr", "INSTALL_BIN=%s" % kvr_bin()],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_reinstall_keeps_edited_config(tmp_path):
    dest = tmp_path / "root"
    conf = dest / "etc" / "kvrouterd" / "kvrouterd.conf"
    dist = dest / "etc" / "kvrouterd" / "kvrouterd.conf.dist"
    shipped = open(os.path.join(REPO, "conf", "kvrouterd.conf"), "rb").read()

    make_install(dest)
    assert conf.read_bytes() == shipped
    assert not dist.exists()
    assert os.access(dest / "usr" / "bin" / "kvrouterd", os.X_OK)
    assert (dest / "lib" / "systemd" / "system" / "kvrouterd.service").is_file()

    edited = shipped + b"\n# edited by the operator\n[log]\nlevel = debug\n"
    conf.write_bytes(edited)
    os.chmod(conf, 0o600)

    out = make_install(dest)
    assert conf.read_bytes() == edited, "make install overwrote the edited configuration"
    assert os.stat(conf).st_mode & 0o777 == 0o600
    assert dist.read_bytes() == shipped
    assert "kvrouterd.conf.dist" in out and "kept" in out, out

    # a third install refreshes the .dist and still keeps the edited file
    dist.write_bytes(b"stale\n")
    make_install(dest)
    assert conf.read_bytes() == edited
    assert dist.read_bytes() == shipped
