"""Self-tests of the integration harness helpers (config rendering, ready-line parsing,
sanitizer detection), so a harness bug cannot hide daemon bugs."""

from kvrharness import (HARNESS_DEFAULTS, merge_config, parse_ready, render_config,
                        sanitizer_report)


def test_merge_and_render():
    cfg = merge_config({"http": {"admin_listen": None, "threads": "2"},
                        "events": {"bind": ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]},
                        "score": {"weight.gpu": "1.0"}})
    assert "admin_listen" not in cfg["http"]
    assert cfg["http"]["listen"] == "127.0.0.1:0"
    assert HARNESS_DEFAULTS["http"]["admin_listen"] == "127.0.0.1:0"  # defaults untouched
    text = render_config(cfg)
    assert text.count("bind = tcp://127.0.0.1:*") == 2
    assert "[score]\nweight.gpu = 1.0\n" in text
    assert "threads = 2" in text and "admin_listen" not in text


def test_parse_ready_text_and_json():
    text = ("2026-11-23T10:00:00.000Z info  kvrouterd 0.1.0 starting\n"
            "2026-11-23T10:00:00.001Z info  kvrouterd ready version=0.1.0 http=127.0.0.1:3456 "
            "admin=127.0.0.1:3457 events=tcp://127.0.0.1:4000,tcp://127.0.0.1:4001\n")
    assert parse_ready(text) == {"version": "0.1.0", "http": "127.0.0.1:3456",
                                 "admin": "127.0.0.1:3457",
                                 "events": "tcp://127.0.0.1:4000,tcp://127.0.0.1:4001"}
    js = '{"ts":"x","level":"info","msg":"kvrouterd ready version=0.1.0 http=[::1]:80"}\n'
    assert parse_ready(js) == {"version": "0.1.0", "http": "[::1]:80"}
    assert parse_ready("kvrouterd starting\n") is None


def test_sanitizer_markers():
    assert sanitizer_report("==1==ERROR: AddressSanitizer: heap-use-after-free") is not None
    assert sanitizer_report("src/x.c:3:5: runtime error: signed integer overflow") is not None
    assert sanitizer_report("==1==ERROR: LeakSanitizer: detected memory leaks") is not None
    assert sanitizer_report("WARNING: ThreadSanitizer: data race") is not None
    assert sanitizer_report("kvrouterd stopped\n") is None
