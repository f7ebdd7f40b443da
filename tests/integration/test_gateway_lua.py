"""kvrouter.lua's own JSON code against Python's json, inside the real HAProxy Lua runtime.

Why: deploy/haproxy/kvrouter.lua carries a small JSON decoder (HAProxy 2.6 has no JSON module)
for kvrouterd's answers, and splices "candidates"/"policy" into the client's JSON body as
text. Both are checked here against Python's json (an implementation we did not write) on
seeded random documents: `haproxy -c` loads kvrouter.lua and a driver that reads the cases
from a file and writes what Lua made of them. Truncated documents must be rejected, never
crash. The seed is printed; KVR_LUA_SEED=<n> replays it.
"""

import json
import os
import random
import shutil
import subprocess
import tempfile

import pytest

from kvrharness import REPO

LUA = os.path.join(REPO, "deploy", "haproxy", "kvrouter.lua")

DRIVER = r'''
local kv = kvrouter_internals
local out = io.open(OUT, "w")
local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
for line in io.lines(IN) do
    local kind, dhex = line:match("^(%a+)\t(%x*)$")
    local doc = dhex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
    if kind == "answer" then
        local v, err = kv.json_decode(doc)
        if type(v) == "table" then
            local n = type(v.candidates) == "table" and #v.candidates or -1
            out:write(string.format("ok\t%s\t%s\t%d\n", hex(tostring(v.pod)),
                                    tostring(v.dp_rank), n))
        else
            out:write("err " .. tostring(err):gsub("[\t\n]", " ") .. "\n")
        end
    else
        local rb = kv.route_body(doc, {"a:1", "pod-b", "10.0.0.1:8000"}, "cost")
        out:write((rb and hex(rb) or "nil") .. "\n")
    end
end
out:close()
'''


def rand_str(rng):
    alphabet = 'abcXYZ019 -_:./"\\\n\t\u00e9\u4e2d\U0001F600\x01'
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def rand_value(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([rng.randrange(-10**6, 10**6), rng.random() * 1e3, True, False,
                           None, rand_str(rng)])
    if r < 0.65:
        return {rand_str(rng): rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return [rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


def answer(rng):
    doc = {"model": rand_str(rng), "pod": rand_str(rng), "dp_rank": rng.randrange(0, 8),
           "matched_blocks": rng.randrange(0, 100), "policy": "cost", "reason": rand_str(rng),
           "candidates": [{"pod": rand_str(rng), "dp_rank": 0, "cost": rng.random() * 10}
                          for _ in range(rng.randrange(0, 5))]}
    for _ in range(rng.randrange(0, 3)):
        doc[rand_str(rng) + "_x"] = rand_value(rng)
    keys = list(doc)
    rng.shuffle(keys)
    doc = {k: doc[k] for k in keys}
    return json.dumps(doc, ensure_ascii=rng.random() < 0.5,
                      indent=rng.choice([None, None, 1]))


def run_lua(cases):
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: `make test` installs it (DEB_GATEWAY)")
    tmp = tempfile.mkdtemp(prefix="kvr-lua-")
    try:
        inp, out = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.txt")
        with open(inp, "w", encoding="utf-8") as f:
            for kind, doc in cases:
                assert "\t" not in kind
                f.write("%s\t%s\n" % (kind, doc.encode().hex()))
        drv = os.path.join(tmp, "driver.lua")
        with open(drv, "w") as f:
            f.write("local IN, OUT = %s, %s\n" % (json.dumps(inp), json.dumps(out)) + DRIVER)
        cfg = os.path.join(tmp, "h.cfg")
        with open(cfg, "w") as f:
            f.write("global\n    lua-load %s\n    lua-load %s\n" % (LUA, drv))
        p = subprocess.run(["haproxy", "-c", "-f", cfg], capture_output=True, text=True,
                           timeout=60)
        # no listener: "has no error but will not start" (exit 2) after the Lua ran
        assert p.returncode in (0, 2) and "has no error" in p.stdout, p.stdout + p.stderr
        with open(out, encoding="utf-8") as f:
            return f.read().splitlines()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_lua_json_and_splice_against_python():
    seed = int(os.environ.get("KVR_LUA_SEED") or random.randrange(1 << 30))
    print("KVR_LUA_SEED=%d" % seed)
    rng = random.Random(seed)
    cases, expect = [], []
    for _ in range(300):
        doc = answer(rng)
        cases.append(("answer", doc))
        v = json.loads(doc)
        expect.append(("ok", v["pod"], v["dp_rank"], len(v["candidates"])))
    for _ in range(300):  # truncated: never valid JSON (the outer object is not closed)
        doc = answer(rng)
        doc = doc[:rng.randrange(0, len(doc.rstrip()) - 1)]
        cases.append(("answer", doc))
        expect.append(("err",))
    bodies = []
    for _ in range(200):
        body = {"model": rand_str(rng), "prompt": rand_str(rng)}
        if rng.random() < 0.2:
            body = {}
        txt = rng.choice(["", " ", "\n"]) + json.dumps(body, indent=rng.choice([None, 2]))
        cases.append(("splice", txt))
        bodies.append(body)
    cases.append(("splice", "[1, 2]"))
    cases.append(("splice", "not json"))
    got = run_lua(cases)
    assert len(got) == len(cases)
    for i, (want, line) in enumerate(zip(expect, got)):
        if want[0] == "err":
            assert line.startswith("err"), (cases[i][1], line)
            continue
        assert line.count("\t") == 3, (cases[i][1], line)
        status, pod_hex, rank, ncand = line.split("\t")
        assert status == "ok" and bytes.fromhex(pod_hex).decode() == want[1], (cases[i], line)
        assert int(rank) == want[2] and int(ncand) == want[3], (cases[i], line)
    for body, line in zip(bodies, got[len(expect):]):
        spliced = json.loads(bytes.fromhex(line).decode())
        want = dict(body, candidates=[{"pod": "a:1"}, {"pod": "pod-b"},
                                      {"pod": "10.0.0.1:8000"}], policy="cost")
        assert spliced == want, (body, spliced)
    assert got[-2:] == ["nil", "nil"]
