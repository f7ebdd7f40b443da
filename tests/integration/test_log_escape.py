"""A publisher's topic reaches the log ("events: new stream pod=... model=..."): with a
newline and ANSI escapes in the pod and model names it must not forge a log line nor put
terminal escapes on the daemon's stderr (text format: escaped; JSON format: one object per
line)."""

import json
import re
import time

from vllm_pub import Engine

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn |info |debug) ")
FORGED = "2026-01-01T00:00:00.000Z error forged: admin token is hunter2"
POD = "evil\n" + FORGED + "\r\n\x1b[2K\x1b[31mred"
MODEL = "m\x1b]0;title\x07\nX"


def publish(d, pod, model):
    with Engine(pod=pod, model=model, mode="connect", endpoints=d.events) as eng:
        eng.wait_subscriber()
        mark = d.log_mark()
        eng.rank(0).publish()
        d.wait_log(r"new stream pod=evil", since=mark, timeout=10)
        # the whole line is in (a write(2) is one line; give the reader a moment)
        deadline = time.monotonic() + 5
        while not d.stderr_text().endswith("\n") and time.monotonic() < deadline:
            time.sleep(0.01)


def test_text_log_escapes_topic(daemon_factory):
    d = daemon_factory()
    publish(d, POD, MODEL)
    err = d.stderr_text()
    assert "\x1b" not in err and "\r" not in err and "\x07" not in err, repr(err)
    lines = err.splitlines()
    for line in lines:
        assert LOG_LINE.match(line), "a line that is not the daemon's own: %r" % line
        assert not line.startswith(FORGED)
    stream = [l for l in lines if "new stream pod=" in l]
    assert len(stream) == 1, lines
    assert ("pod=evil\\n" + FORGED + "\\r\\n\\e[2K\\e[31mred model=m\\e]0;title\\x07\\nX") \
        in stream[0]


def test_json_log_one_object_per_line(daemon_factory):
    d = daemon_factory({"log": {"format": "json"}})
    publish(d, POD, MODEL)
    err = d.stderr_text()
    assert "\x1b" not in err and "\r" not in err, repr(err)
    msgs = [json.loads(line)["msg"] for line in err.splitlines()]
    stream = [m for m in msgs if m.startswith("events: new stream pod=")]
    assert len(stream) == 1, msgs
    assert "pod=%s model=%s " % (POD, MODEL) in stream[0]
