"""src/ folders are layers: scripts/check-layers.py holds the map and refuses includes that run
upward without a comment saying why. This runs it on the tree and on small trees made to break it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check-layers.py")


def run(src):
    return subprocess.run([sys.executable, CHECK, str(src)], capture_output=True, text=True, timeout=60)


def tree(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_tree_follows_the_map():
    r = run(os.path.join(ROOT, "src"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_downward_and_same_folder_includes_pass(tmp_path):
    src = tree(tmp_path, {
        "core/log.h": "",
        "index/index.h": '#include "core/log.h"\n',
        "index/index.c": '#include "index/index.h"\n#include "core/log.h"\n',
    })
    r = run(src)
    assert r.returncode == 0, r.stdout


def test_upward_include_is_refused(tmp_path):
    src = tree(tmp_path, {
        "core/log.h": "",
        "index/index.h": "",
        "core/log.c": '#include "core/log.h"\n#include "index/index.h"\n',
    })
    r = run(src)
    assert r.returncode == 1
    assert "core/log.c:2: core -> index" in r.stdout


def test_sideways_include_between_siblings_is_refused(tmp_path):
    # text and events both sit on core/index; neither may use the other
    src = tree(tmp_path, {"events/ingest.h": "", "text/tok.c": '#include "events/ingest.h"\n'})
    r = run(src)
    assert r.returncode == 1 and "text -> events" in r.stdout


def test_upward_include_with_a_reason_passes(tmp_path):
    src = tree(tmp_path, {
        "route/route.h": "",
        "events/ingest.c": '#include "route/route.h" /* upward: prefill confirmations */\n',
    })
    assert run(src).returncode == 0


def test_bare_header_names_and_stray_files_are_refused(tmp_path):
    src = tree(tmp_path, {"core/log.h": "", "core/log.c": '#include "log.h"\n', "loose.c": ""})
    r = run(src)
    assert r.returncode == 1
    assert "core/log.c:1" in r.stdout and "loose.c" in r.stdout


def test_unknown_folder_is_refused(tmp_path):
    r = run(tree(tmp_path, {"misc/x.c": ""}))
    assert r.returncode == 1 and "misc" in r.stdout
