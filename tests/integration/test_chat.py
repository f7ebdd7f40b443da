"""Chat messages in, end to end: the daemon renders each model's own chat template (tmpl) and
tokenizes the result; the reference is the rendered text from Debian's python3-jinja2 as
transformers configures it (tests/data/tmpl/goldens.jsonl, scripts/tmpl-goldens.py).

For every golden conversation of the reference models' templates whose messages vLLM would
pass through unchanged, /v1/tokenize with the messages must return exactly the ids of the
golden text (the tokenizer itself is proven against its own goldens): byte-level BPE ids
equal <=> texts equal. Also: raw OpenAI bodies (chat and completions) as they are, errors,
the prefix cache serving a growing conversation, and chat scores matching published blocks.
"""

import json
import os

import pytest

from test_ingest import metric, wait_pod, warm
from test_tokenize import TOKREF, bin_sanitized, goldens, need_tokref, start
from kvrharness import REPO
from vllm_pub import Engine

GOLDENS = os.path.join(REPO, "tests", "data", "tmpl", "goldens.jsonl")
MODELS = ["qwen3", "llama3", "deepseek_v3", "gemma3"]
PASS_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}


def cfg(models):
    c = {'model "chat/%s"' % m: {"tokenizer": os.path.join(TOKREF, m)} for m in models}
    c['model "chat/llama2"'] = {"tokenizer": os.path.join(TOKREF, "llama2")}  # no template
    return c


def passthrough(msgs):
    """Messages vLLM hands to the template unchanged: string content, known keys."""
    for m in msgs:
        if not isinstance(m.get("content"), str) or set(m) - PASS_KEYS:
            return False
        if "tool_calls" in m and m["role"] != "assistant":
            return False
        if "tool_call_id" in m and m["role"] != "tool":
            return False
        for tc in m.get("tool_calls") or []:
            if not isinstance(tc.get("function", {}).get("arguments", {}), dict):
                return False
    return True


def cases(models):
    out = []
    with open(GOLDENS, encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            if c.get("template") not in models or "output" not in c:
                continue
            v = c["vars"]
            if not passthrough(v.get("messages", [])):
                continue
            out.append(c)
    return out


def chat_body(c, messages=None):
    """A golden case's variables as a chat request body (what vLLM would have rendered)."""
    v = c["vars"]
    body = {"model": "chat/" + c["template"], "messages": messages or v["messages"]}
    for k in ("tools", "documents", "add_generation_prompt"):
        if v.get(k) is not None:
            body[k] = v[k]
    kw = {k: x for k, x in v.items() if k not in ("messages", "tools", "documents",
                                                 "add_generation_prompt", "bos_token",
                                                 "eos_token")}
    if kw:
        body["chat_template_kwargs"] = kw
    return body


def tokenize(d, body):
    st, res = d.json("POST", "/v1/tokenize", body)
    assert st == 200, (body, res)
    return res["tokens"]


def test_chat_matches_jinja2(daemon_factory):
    models = ["qwen3", "gemma3"] if bin_sanitized() else MODELS
    d = start(daemon_factory, cfg(models))
    n = {m: 0 for m in models}
    step = 3 if bin_sanitized() else 1  # every case in-process under sanitizers: test_tmpl
    for i, c in enumerate(cases(models)):
        if i % step:
            continue
        got = tokenize(d, chat_body(c))
        want = tokenize(d, {"model": "chat/" + c["template"], "prompt": c["output"],
                            "add_special_tokens": False})
        assert got == want, (c["name"], c["output"][:300])
        n[c["template"]] += 1
    print("chat goldens matched:", n)
    assert all(x * step >= 20 for x in n.values()), n


# Templates that loop over a message's content (vLLM's "openai" content format): they get the
# text parts as they are; the others get the parts' texts joined with "\n".
PARTS_TEMPLATES = {"gemma3"}


def test_chat_nul_matches_references(daemon_factory):
    """U+0000 in message contents (strings and text parts), tools, tool calls and
    chat_template_kwargs: the daemon renders and tokenizes the chat to exactly the ids the
    reference tokenizer (transformers.js, tests/data/tok goldens) gives for the text the
    reference Jinja2 rendered (tests/data/tmpl goldens); where Jinja2 raised, a 400."""
    models = ["qwen3", "gemma3"] if bin_sanitized() else MODELS
    d = start(daemon_factory, cfg(models))
    recs = {}
    with open(GOLDENS, encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            if c.get("template") in models and "/nul_" in c["name"]:
                recs[c["name"]] = c
    n = 0
    for m in models:
        ref = {c["text"]: c["ids"] for c in goldens(m) if not c["add_special_tokens"]}
        for conv in ("nul_content", "nul_tools", "nul_kwargs", "nul_parts"):
            c = recs[m + "/" + conv]
            body = chat_body(c)
            if conv == "nul_parts" and m not in PARTS_TEMPLATES:
                # vLLM joins the parts for a string template: that render is nul_parts_joined
                c = recs[m + "/nul_parts_joined"]
            st, res = d.json("POST", "/v1/tokenize", body)
            if "output" not in c:  # Jinja2 raised (e.g. Gemma 3 refuses a tool turn)
                assert st == 400, (c["name"], res)
                continue
            assert st == 200, (c["name"], res)
            assert "\0" in c["output"] or conv == "nul_kwargs", c["name"]
            want = ref.get(c["output"])
            assert want is not None, ("no tokenizer golden for", c["name"])
            assert res["tokens"] == want, (c["name"], repr(c["output"][:300]))
            n += 1
    print("chat NUL goldens matched:", n)
    assert n >= 3 * len(models), n


def test_raw_openai_bodies_and_errors(daemon_factory):
    d = start(daemon_factory, dict(cfg(["qwen3", "gemma3"]),
                                   tokenizer={"max_prompt_bytes": "2KiB"}))
    chat = {"model": "chat/qwen3", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                     {"type": "text", "text": "there"}]}],
        "max_tokens": 64, "temperature": 0.2, "stream": True, "n": 1, "top_p": 0.9,
        "chat_template_kwargs": {"enable_thinking": False}}
    ids = tokenize(d, chat)
    # text parts are joined with "\n" for Qwen3's template (it does not loop over content)
    text = tokenize(d, {"model": "chat/qwen3", "add_special_tokens": False,
                        "prompt": "<|im_start|>system\nYou are terse.<|im_end|>\n"
                                  "<|im_start|>user\nHi\nthere<|im_end|>\n"
                                  "<|im_start|>assistant\n<think>\n\n</think>\n\n"})
    assert ids == text
    # the same body scores and routes as it is
    st, res = d.json("POST", "/v1/score", chat)
    assert st == 200 and res["tokens"] == len(ids)
    # /v1/completions bodies: a string, or one array of ids; a batch is refused
    comp = {"model": "chat/qwen3", "prompt": "Hello world", "max_tokens": 5, "echo": False}
    assert tokenize(d, comp) == [9707, 1879]
    st, res = d.json("POST", "/v1/score", {"model": "chat/qwen3", "prompt": [9707, 1879]})
    assert st == 200 and "tokens" not in res
    for bad, code in (({"model": "chat/qwen3", "prompt": ["a", "b"]}, 400),
                      ({"model": "chat/qwen3", "prompt": [[1], [2]]}, 400),
                      ({"model": "chat/qwen3", "messages": [{"role": "user", "content": [
                          {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400),
                      ({"model": "chat/qwen3", "messages": [{"content": "no role"}]}, 400),
                      ({"model": "chat/qwen3", "messages": {"role": "user"}}, 400),
                      ({"model": "chat/qwen3", "messages": [], "prompt": "x"}, 400),
                      ({"model": "chat/llama2", "messages": [{"role": "user", "content": "x"}]},
                       400),
                      ({"model": "chat/qwen3", "messages": [{"role": "user", "content": "x"}],
                        "continue_final_message": True}, 400)):
        st, res = d.json("POST", "/v1/tokenize", bad)
        assert st == code, (bad, res)
    st, res = d.json("POST", "/v1/tokenize", {"model": "chat/qwen3", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})
    assert "multimodal content is not supported" in res["error"]
    # continue_final_message: the output ends with the final message's text
    cont = tokenize(d, {"model": "chat/qwen3", "add_generation_prompt": False,
                        "continue_final_message": True, "messages": [
                            {"role": "user", "content": "Write a haiku"},
                            {"role": "assistant", "content": "Autumn moonlight"}]})
    ref = tokenize(d, {"model": "chat/qwen3", "add_special_tokens": False,
                       "prompt": "<|im_start|>user\nWrite a haiku<|im_end|>\n"
                                 "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                 "Autumn moonlight"})
    assert cont == ref  # Qwen3's template gives the last assistant turn empty think tags
    # a system prompt alone renders (python3-jinja2 gives exactly this text)
    sys_only = tokenize(d, {"model": "chat/qwen3", "messages": [
        {"role": "system", "content": "only a system prompt"}]})
    assert sys_only == tokenize(d, {"model": "chat/qwen3", "add_special_tokens": False,
                                    "prompt": "<|im_start|>system\nonly a system prompt"
                                              "<|im_end|>\n<|im_start|>assistant\n"})
    # raise_exception in a template is a 400 carrying its message (Gemma 3's alternation)
    st, res = d.json("POST", "/v1/tokenize", {"model": "chat/gemma3", "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    assert st == 400 and "roles must alternate" in res["error"], res
    # a render past [tokenizer] max_prompt_bytes (2 KiB here) is a 413
    st, res = d.json("POST", "/v1/tokenize", {"model": "chat/qwen3", "messages": [
        {"role": "user", "content": "x " * 1500}]})
    assert st == 413 and "rendered chat" in res["error"], res


def test_conversation_prefix_cache_and_scores(daemon_factory):
    d = start(daemon_factory, cfg(["qwen3"]))
    base = "You are a meticulous assistant. " * 200  # a long system prompt (~6 KB)
    msgs = [{"role": "system", "content": base}]
    with Engine(pod="pod-chat", model="chat/qwen3", mode="connect", endpoints=d.events,
                block_size=16, num_blocks=4096) as eng:
        warm(eng, d, "pod-chat")
        r = eng.rank(0)
        for turn in range(6):
            msgs.append({"role": "user", "content": "Question %d: %s" % (turn, "why? " * 300)})
            body = {"model": "chat/qwen3", "messages": msgs}
            ids = tokenize(d, body)
            r.request(ids)  # the engine computed this prompt
            wait_pod(d, "pod-chat", seq=r.publish())
            st, res = d.json("POST", "/v1/score", body)
            assert st == 200
            assert res["scores"][0]["pod"] == "pod-chat"
            assert res["scores"][0]["matched_blocks"] == len(ids) // 16
            msgs.append({"role": "assistant", "content": "Answer %d." % turn})
    # each turn resumed from the previous ones
    assert metric(d, "tokenizer_prefix_cache_hits_total") >= 5
    assert metric(d, "tokenizer_chats_total") >= 12


def test_template_outside_the_subset_fails_at_load(tmp_path):
    need_tokref()
    from kvrharness import run_kvr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n"
                   "{% include 'other.jinja' %}\n")
    conf = tmp_path / "k.conf"
    conf.write_text('[events]\nbind = tcp://127.0.0.1:*\n[http]\nlisten = 127.0.0.1:0\n'
                    '[model "m"]\ntokenizer = %s\nchat_template = bad.jinja\n'
                    % os.path.join(TOKREF, "llama2"))
    r = run_kvr(["-t", "-c", str(conf)], timeout=30)
    assert r.returncode == 1, r.stderr
    err = r.stderr.strip()
    assert err.startswith('%s:7: [model "m"] chat template %s: line 2:' % (conf, bad)), err
