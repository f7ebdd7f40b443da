"""Large texts off the HTTP loop (issue #27), against the real daemon over loopback.

[tokenizer] threads run the tokenization (and chat rendering) of large bodies; the loop keeps
answering other requests meanwhile. These tests use one loop thread ([http] threads = 1) so
that anything still done on the loop would block the probes, and the reference tokenizers
(build/tokref, as test_tokenize.py). What they show:
- /healthz and small /v1/score answered while a large prompt is tokenized: several answers
  arrive before the large one, and none waits anywhere near as long as the large request
  takes (on a loop that tokenizes inline, the first probe waits for the whole tokenization);
- a prompt past [http] max_query_tokens is refused without tokenizing the rest: BPE sees a
  small part of it (kvrouter_tokenizer_bpe_bytes_total), for tokenizers with and without
  the raw-length bound;
- the queue bound: 503 with Retry-After, counted;
- connections reset while their text is queued or running: the queued one is not
  tokenized, the daemon carries on (ASan/TSan builds: no report);
- pipelined answers keep their order, and a client pipelining large bodies takes turns with
  another client's large body; an answer that comes back while the connection's output is
  being written waits for that write;
- off the loop, every endpoint that tokenizes or renders answers exactly as inline.
Orderings and ratios are asserted, never absolute times.
"""

import json
import os
import random
import signal
import socket
import struct
import threading
import time

import pytest

from kvrharness import kvr_bin
from test_ingest import metric, need_http
from test_tokenize import TOKREF, bin_sanitized, need_tokref


def cfg(models, tokenizer=None, http=None):
    c = {'model "test/%s"' % m: {"tokenizer": os.path.join(TOKREF, m)} for m in models}
    c["http"] = {"threads": "1", "max_query_tokens": "4000000"}
    c["http"].update(http or {})
    c["tokenizer"] = {"threads": os.environ.get("KVR_TEST_TEXT_THREADS", "1"), "prefix_cache": "0",
                      "max_prompt_bytes": "8MiB"}
    c["tokenizer"].update(tokenizer or {})
    return c


def start(daemon_factory, c):
    need_tokref()
    d = daemon_factory(c, ready_timeout=90)
    need_http(d)
    return d


WORDS = None


def prose(nbytes, seed):
    """Text of about nbytes: random words (a different text per seed: no cache helps)."""
    global WORDS
    rng = random.Random(seed)
    if WORDS is None:
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        WORDS = ["".join(random.Random(i).choice(letters) for _ in range(2 + i % 9))
                 for i in range(5000)]
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        if rng.random() < 0.1:
            w = w.capitalize() + rng.choice([".", ",", ";", "!"])
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def hard(nbytes, seed):
    """Text of long random words (25-60 letters): the word cache never helps, so BPE works
    on every byte (Gemma 3: ~100 ms per MiB in a release build)."""
    rng = random.Random(seed)
    out, n = [], 0
    while n < nbytes:
        w = "".join(rng.choice("etaoinshrdlucmfwypvbgkjqxz") for _ in range(rng.randint(25, 60)))
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def big_size():
    # 4 MiB in release (Gemma 3: ~400 ms); ASan builds are ~10x slower, TSan ~100x
    if not bin_sanitized():
        return 4 << 20
    with open(kvr_bin(), "rb") as f:
        return (256 << 10) if b"__tsan_init" in f.read() else (1 << 20)


def big_text(seed):
    return hard(big_size(), seed)


def http_bytes(method, path, obj=None, extra=""):
    body = json.dumps(obj).encode() if obj is not None else b""
    head = "%s %s HTTP/1.1\r\nHost: t\r\n%s" % (method, path, extra)
    if obj is not None:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return (head + "\r\n").encode() + body


def read_response(f):
    """(status, headers lower-cased, body) from a buffered socket file."""
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    status = int(line.split()[1])
    headers = {}
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    body = f.read(n)
    return status, headers, body


def conn(d, timeout=120):
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def reset(s):
    """Close with a reset (SO_LINGER 0): the daemon's next read fails with ECONNRESET."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def tokenize_req(model, text, extra=""):
    return http_bytes("POST", "/v1/tokenize", {"model": "test/" + model, "prompt": text}, extra)


def score_req(model, text):
    """A text to score: the answer is small whatever the text's size."""
    return http_bytes("POST", "/v1/score", {"model": "test/" + model, "prompt": text})


def test_probes_answered_while_large_prompt_tokenizes(daemon_factory):
    d = start(daemon_factory, cfg(["gemma3"]))
    text = big_text(seed=1)
    big = conn(d)
    bf = big.makefile("rb")
    result = {}

    def read_big():
        result["resp"] = read_response(bf)
        result["done"] = time.monotonic()

    big.sendall(score_req("gemma3", text))
    t0 = time.monotonic()
    reader = threading.Thread(target=read_big)
    reader.start()
    p = conn(d, timeout=60)
    pf = p.makefile("rb")
    probes = []  # (sent, answered)
    score = {"model": "test/gemma3", "token_ids": list(range(64))}
    i = 0
    while reader.is_alive() and i < 10000:
        req = http_bytes("GET", "/healthz") if i % 2 == 0 else \
            http_bytes("POST", "/v1/score", score)
        sent = time.monotonic()
        p.sendall(req)
        status, _, body = read_response(pf)
        assert status == 200, body
        probes.append((sent, time.monotonic()))
        i += 1
        time.sleep(0.005)
    reader.join(timeout=120)
    status, _, body = result["resp"]
    assert status == 200, body[:200]
    assert json.loads(body)["tokens"] > 100000
    duration = result["done"] - t0
    before = [pr for pr in probes if pr[1] < result["done"]]
    worst = max(b - a for a, b in before) if before else duration
    print("large prompt %.0f ms; %d probes answered before it, worst wait %.1f ms"
          % (duration * 1000, len(before), worst * 1000))
    # tokenized inline, the loop answers nothing until the large prompt is done: the first
    # probe waits for almost all of it and hardly any answer comes before it
    assert len(before) >= 3, "only %d probe(s) answered during a %.0f ms tokenization" % (
        len(before), duration * 1000)
    assert worst < duration / 2, "a probe waited %.0f ms of the large request's %.0f ms" % (
        worst * 1000, duration * 1000)
    assert metric(d, "text_jobs_total") >= 1
    p.close()
    big.close()


@pytest.mark.parametrize("model", ["gemma3", "qwen3", "llama2"])
def test_limit_refuses_without_tokenizing_the_rest(daemon_factory, model):
    d = start(daemon_factory, cfg([model], http={"max_query_tokens": "1000"}))
    text = prose(512 << 10, seed=2)
    bpe0 = metric(d, "tokenizer_bpe_bytes_total")
    stops0 = metric(d, "tokenizer_limit_stops_total")
    assert bpe0 is not None and stops0 is not None, "no limit counters in /metrics"
    for path, obj in (("/v1/tokenize", {"model": "test/" + model, "prompt": text}),
                      ("/v1/score", {"model": "test/" + model, "prompt": text})):
        status, body = d.json("POST", path, obj, timeout=60)
        assert status == 413, body
        assert "more than [http] max_query_tokens (1000)" in body["error"]
    bpe = metric(d, "tokenizer_bpe_bytes_total") - bpe0
    print("%s: 2 x %d bytes refused after %d bytes of BPE" % (model, len(text), bpe))
    assert bpe < len(text) // 20, "BPE ran over %d of %d bytes" % (bpe, len(text))
    assert metric(d, "tokenizer_limit_stops_total") - stops0 == 2
    assert metric(d, "http_limit_rejections_total", 'kind="tokens"') >= 2
    # a text that fits is still tokenized in full
    status, body = d.json("POST", "/v1/tokenize", {"model": "test/" + model,
                                                   "prompt": prose(1000, seed=3)})
    assert status == 200 and 0 < body["count"] <= 1000, body


def test_queue_full_answers_503_with_retry_after(daemon_factory):
    d = start(daemon_factory, cfg(["gemma3"], tokenizer={"queue": "1", "offload_bytes": "1KiB"}))
    reqs = [score_req("gemma3", big_text(seed=10 + k)) for k in range(5)]  # made first
    socks = []
    for r in reqs:  # one runs, one waits, the rest find the queue full
        s = conn(d)
        s.sendall(r)
        socks.append(s)
    answers = [read_response(s.makefile("rb")) for s in socks]
    statuses = [a[0] for a in answers]
    print("statuses", statuses)
    rejected = [a for a in answers if a[0] == 503]
    assert len(rejected) >= 1 and statuses[0] == 200, statuses
    assert set(statuses) <= {200, 503}, statuses
    for status, headers, body in rejected:
        assert headers.get("retry-after") == "1"
        assert "[tokenizer] queue" in json.loads(body)["error"]
    assert metric(d, "http_limit_rejections_total", 'kind="text_queue"') == len(rejected)
    assert metric(d, "text_rejected_total") == len(rejected)
    for s in socks:
        s.close()


def test_reset_while_queued_or_running(daemon_factory):
    d = start(daemon_factory, cfg(["gemma3"]))
    ra, rb = score_req("gemma3", big_text(seed=20)), score_req("gemma3", big_text(seed=21))
    a = conn(d)
    a.sendall(ra)  # runs
    b = conn(d)
    b.sendall(rb)  # waits behind a
    time.sleep(0.05)
    reset(b)  # reset while queued: never tokenized
    reset(a)  # reset while running: its answer is dropped when it comes back
    c = conn(d)
    c.sendall(score_req("gemma3", hard(64 << 10, seed=22)))
    status, _, body = read_response(c.makefile("rb"))
    assert status == 200, body[:200]
    c.close()
    deadline = time.monotonic() + 60
    while metric(d, "text_running") or metric(d, "text_queued"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert metric(d, "text_cancelled_total") == 1
    assert metric(d, "text_jobs_total") == 3
    status, _ = d.json("GET", "/healthz")
    assert status == 200


def test_pipelined_order_and_turns(daemon_factory):
    d = start(daemon_factory, cfg(["gemma3"]))
    small = prose(100, seed=30)
    n = big_size() // 2
    # one connection: large, probe, small, large: answers in request order
    s = conn(d)
    f = s.makefile("rb")
    s.sendall(score_req("gemma3", hard(n, seed=31)) + http_bytes("GET", "/healthz") +
              tokenize_req("gemma3", small) + score_req("gemma3", hard(n // 2, seed=32)))
    got = [json.loads(g[2]) for g in (read_response(f) for _ in range(4))]
    assert got[1] == {"status": "ok"}, got[1]
    assert got[0]["tokens"] > 1.5 * got[3]["tokens"] > 1000, (got[0], got[3])
    assert 0 < got[2]["count"] < 100, got[2]
    s.close()
    # a client pipelining three large bodies, and another client's one large body sent while
    # the first of them is tokenized: that one is answered before the pipeliner's third
    a = conn(d)
    af = a.makefile("rb")
    b = conn(d)
    bf = b.makefile("rb")
    ra = b"".join(score_req("gemma3", hard(n, seed=40 + k)) for k in range(3))
    rb = score_req("gemma3", hard(n, seed=50))
    a.sendall(ra)
    time.sleep(0.02)
    b.sendall(rb)
    order = []
    lock = threading.Lock()

    def reader(name, f, count):
        for k in range(count):
            status, _, body = read_response(f)
            assert status == 200, body[:200]
            with lock:
                order.append("%s%d" % (name, k))

    ta = threading.Thread(target=reader, args=("a", af, 3))
    tb = threading.Thread(target=reader, args=("b", bf, 1))
    ta.start()
    tb.start()
    ta.join(timeout=120)
    tb.join(timeout=120)
    print("order", order)
    assert len(order) == 4
    assert order.index("b0") < order.index("a2"), order
    a.close()
    b.close()


def test_answer_waits_for_the_write_before_it(daemon_factory):
    """A client that does not read: the answers before a text request (/metrics, large) fill
    the socket, so a write still owns the connection's output when the text's answer comes
    back; the answer is framed only once that write is done (appending to the buffer a write
    is sending from could move it). This drives that path (on_write frames the answer) and
    checks every answer arrives whole and in order; whether an append would have moved the
    buffer depends on how much the kernel took, so the move itself is not provoked here."""
    c = cfg(["gemma3"], tokenizer={"offload_bytes": "1KiB"}, http={"max_output_bytes": "64MiB"})
    c["http"]["admin_listen"] = None  # /metrics on the main listener: large answers
    d = start(daemon_factory, c)
    text = prose(4 << 10, seed=60)
    status, body = d.json("POST", "/v1/tokenize", {"model": "test/gemma3", "prompt": text})
    assert status == 200
    want = body["tokens"]
    jobs0 = metric(d, "text_jobs_total")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.settimeout(60)
    s.connect(("127.0.0.1", d.http_port))
    nm = 250  # more than the kernel's send buffer takes (tcp_wmem's 4 MiB at most)
    s.sendall(http_bytes("GET", "/metrics") * nm + tokenize_req("gemma3", text))
    deadline = time.monotonic() + 60
    while metric(d, "text_jobs_total") < jobs0 + 1 or metric(d, "text_running") or \
            metric(d, "text_queued"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)  # the job is back on the loop, whose write is still blocked
    f = s.makefile("rb")
    total = 0
    for k in range(nm):
        status, _, body = read_response(f)
        assert status == 200 and body.startswith(b"# HELP"), body[:100]
        total += len(body)
    status, _, body = read_response(f)
    assert status == 200, body[:200]
    assert json.loads(body)["tokens"] == want
    print("%d bytes of /metrics answers before the text's" % total)
    s.close()


def test_off_loop_answers_equal_inline(daemon_factory):
    """Every endpoint that tokenizes or renders, with a large body: the text threads answer
    exactly what the loop answers inline ([tokenizer] threads = 0): /v1/tokenize with chat
    messages, /v1/score with a prompt, /v1/route with messages and candidates."""
    msgs = [{"role": "system", "content": "You are terse."}]
    for t in range(6):
        msgs.append({"role": "user" if t % 2 == 0 else "assistant",
                     "content": prose(6000, seed=80 + t)})
    reqs = [("/v1/tokenize", {"model": "test/qwen3", "messages": msgs}),
            ("/v1/score", {"model": "test/qwen3", "prompt": prose(40000, seed=90)}),
            ("/v1/route", {"model": "test/qwen3", "messages": msgs,
                           "candidates": [{"pod": "10.0.0.1"}, {"pod": "10.0.0.2"}]})]
    answers = []
    for threads in ("1", "0"):
        d = start(daemon_factory, cfg(["qwen3"], tokenizer={"threads": threads}))
        jobs0 = metric(d, "text_jobs_total") or 0
        got = []
        for path, obj in reqs:
            status, body = d.json("POST", path, obj, timeout=60)
            assert status == 200, (path, body)
            got.append(body)
        assert (metric(d, "text_jobs_total") or 0) - jobs0 == (3 if threads == "1" else 0)
        answers.append(got)
        d.stop()
    off, inline = answers
    assert off[0]["tokens"] == inline[0]["tokens"] and off[0]["count"] > 5000
    assert off[1] == inline[1] and off[1]["tokens"] > 5000
    assert off[2]["tokens"] == inline[2]["tokens"] == off[0]["count"]
    assert off[2]["pod"] in ("10.0.0.1", "10.0.0.2")


def test_sigterm_with_texts_out(daemon_factory):
    """SIGTERM while one large text runs and another waits: the running one is answered,
    the waiting one is not tokenized (503 with Retry-After), and the daemon exits 0."""
    d = start(daemon_factory, cfg(["gemma3"]))
    ra, rb = score_req("gemma3", big_text(seed=100)), score_req("gemma3", big_text(seed=101))
    a = conn(d)
    a.sendall(ra)
    b = conn(d)
    b.sendall(rb)
    deadline = time.monotonic() + 60
    while metric(d, "text_queued") != 1:  # a runs, b waits
        assert time.monotonic() < deadline
        time.sleep(0.01)
    d.signal(signal.SIGTERM)
    sa, _, body_a = read_response(a.makefile("rb"))
    sb, hb, body_b = read_response(b.makefile("rb"))
    assert sa == 200 and json.loads(body_a)["tokens"] > 1000, body_a[:200]
    assert sb == 503 and hb.get("retry-after") == "1", body_b
    assert "shutting down" in json.loads(body_b)["error"]
    assert d.stop() == 0
    a.close()
    b.close()
