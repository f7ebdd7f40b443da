"""The gateways' own parsing code against Python's json, inside the real runtimes.

Why: deploy/haproxy/kvrouter.lua carries a small JSON decoder (HAProxy 2.6 has no JSON module)
for kvrouterd's answers, and splices "candidates"/"policy" into the client's JSON body as
text. Both are checked here against Python's json (an implementation we did not write) on
seeded random documents: `haproxy -c` loads kvrouter.lua and a driver that reads the cases
from a file and writes what Lua made of them. Truncated documents must be rejected, never
crash. Likewise kvrouter.js's splice and its $kvr_engines parser, run by nginx's njs module
(a test location imports the shipped file). The seed is printed; KVR_LUA_SEED=<n> replays it.
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


NJS_TEST = r'''
import kvr from 'kvrouter.js';
function splice(r) {
    var e = kvr.parseEngines(r.headersIn['X-Engines']);
    var out = kvr.routeBody(r.requestText, e.pods, r.headersIn['X-Policy'] || '');
    r.return(200, JSON.stringify({body: out, map: e.map}));
}
export default {splice};
'''


def test_njs_splice_and_engine_list_against_python():
    """kvrouter.js's body splice and $kvr_engines parsing, run by the real nginx njs module
    (a test location imports the shipped module), checked with Python's json."""
    if shutil.which("nginx") is None or not os.path.exists(
            "/usr/lib/nginx/modules/ngx_http_js_module.so"):
        pytest.fail("nginx + njs are not installed: `make test` installs them (DEB_GATEWAY)")
    import http.client
    import gwload
    seed = int(os.environ.get("KVR_LUA_SEED") or random.randrange(1 << 30))
    print("KVR_LUA_SEED=%d" % seed)
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="kvr-njs-")
    os.chmod(tmp, 0o755)
    port = gwload.free_port()
    with open(os.path.join(tmp, "t.js"), "w") as f:
        f.write(NJS_TEST)
    shutil.copy(os.path.join(REPO, "deploy", "nginx", "kvrouter.js"), tmp)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write("load_module /usr/lib/nginx/modules/ngx_http_js_module.so;\n"
                "pid %s/nginx.pid;\nerror_log %s/error.log info;\nevents {}\n"
                "http {\n access_log off;\n js_path %s;\n js_import t from t.js;\n"
                " client_body_temp_path %s;\n client_body_buffer_size 1m;\n"
                " server { listen 127.0.0.1:%d; location / { js_content t.splice; } }\n}\n"
                % (tmp, tmp, tmp, tmp, port))
    proc = subprocess.Popen(["nginx", "-p", tmp, "-c", conf, "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        for _ in range(100):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/")
                conn.getresponse().read()
                break
            except OSError:
                import time
                time.sleep(0.05)
        for i in range(150):
            pods = ["%s:%d" % (rng.choice(["10.0.0.%d" % rng.randrange(256), "host-%d.x" % i]),
                               rng.randrange(1, 65536)) for _ in range(rng.randrange(0, 4))]
            named = {"p%d" % k: p for k, p in enumerate(pods) if rng.random() < 0.5}
            items = [("%s=%s" % (k, v)) for k, v in named.items()] + \
                    [p for p in pods if p not in named.values()]
            bad = rng.random() < 0.2
            if bad:
                items.append("bad=not-an-address")
            policy = rng.choice(["", "cost", "score"])
            body = {"model": rand_str(rng), "prompt": rand_str(rng)} if rng.random() < 0.8 \
                else {}
            txt = rng.choice(["", " ", "\n"]) + json.dumps(body, indent=rng.choice([None, 2]))
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("POST", "/", body=txt.encode(),
                         headers={"X-Engines": " ".join(items), "X-Policy": policy})
            res = json.loads(conn.getresponse().read())
            conn.close()
            want_map = {k: v for k, v in named.items()}
            want_map.update({p: p for p in pods if p not in named.values()})
            assert res["map"] == want_map, (items, res)
            want = dict(body)
            order = [k for k in named] + [p for p in pods if p not in named.values()]
            if order:
                want["candidates"] = [{"pod": p} for p in order]
            if policy:
                want["policy"] = policy
            assert json.loads(res["body"]) == want, (txt, res["body"])
        for bad in ("[1, 2]", "not json", ""):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("POST", "/", body=bad.encode(), headers={"X-Engines": "a:1"})
            assert json.loads(conn.getresponse().read())["body"] is None, bad
            conn.close()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
