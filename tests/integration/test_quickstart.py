"""The README's quick start: scripts/publish-demo.py feeds a running kvrouterd like one vLLM
engine, and the score query it prints finds the blocks (the README shows this output)."""

import os
import subprocess
import sys
import time

from kvrharness import REPO

DEMO = os.path.join(REPO, "scripts", "publish-demo.py")


def test_publish_demo_then_score(daemon_factory):
    d = daemon_factory()
    q = {"model": "demo/model", "token_ids": list(range(64))}
    status, res = d.json("POST", "/v1/score", q)
    assert status == 200 and res["block_size"] is None and res["scores"] == [], res

    r = subprocess.run([sys.executable, DEMO, "--endpoint", d.events[0]], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 block(s) of 16 tokens stored by pod demo-pod" in r.stdout, r.stdout
    assert "/v1/score" in r.stdout

    deadline = time.monotonic() + 10  # the writer thread applies the batch
    while True:
        status, res = d.json("POST", "/v1/score", q)
        assert status == 200, res
        if res["scores"] or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert res == {"model": "demo/model", "block_size": 16, "query_blocks": 4,
                   "scores": [{"pod": "demo-pod", "dp_rank": 0, "matched_blocks": 4,
                               "matched_tokens": 64, "tiers": {"gpu": 4}, "score": 4}]}, res


def test_publish_demo_no_daemon_fails_clearly():
    r = subprocess.run([sys.executable, DEMO, "--endpoint", "tcp://127.0.0.1:9",
                        "--timeout", "0.5"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "did not subscribe" in r.stderr, r.stderr
