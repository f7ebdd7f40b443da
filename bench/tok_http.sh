#!/bin/sh
# tok_http.sh — POST /v1/score with an 8K-token prompt as text, and with a raw
# /v1/chat/completions body of ~8K tokens (10 turns, Qwen3's chat template), one loop thread:
# requests/s and latency cold (no prefix cache: every request tokenizes its whole prompt) and
# warm (prefix cache on, the prompts seen before), beside the same queries as token ids, in
# one run (interleaved rounds, best of each kept: the machine is shared).
#
# Two daemons ([http] threads = 1, Qwen3's tokenizer from build/tokref): one with
# [tokenizer] prefix_cache = 0 (cold), one with 64MiB (warm; token ids are asked of it too).
# Bodies: 16 prompts of the goldens' 20 KB document extended to ~8K Qwen3 tokens, each with a
# different first line (so they are 16 texts); their ids come from the daemon's own
# /v1/tokenize. The index is empty (this measures the text path; bench/http.sh measures
# scoring against a loaded index).
# Environment: BUILD, PYTHON, TOKREF (build/tokref), TOKHTTP_SECONDS (5), TOKHTTP_CONNS (4),
# TOKHTTP_ROUNDS (2).
set -eu
BUILD=${BUILD:-build/release}
PYTHON=${PYTHON:-/usr/bin/python3}
TOKREF=${TOKREF:-build/tokref}
DUR=${TOKHTTP_SECONDS:-5}
CONNS=${TOKHTTP_CONNS:-4}
ROUNDS=${TOKHTTP_ROUNDS:-2}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BIN=${KVR_BIN:-$root/$BUILD/kvrouterd}
command -v wrk >/dev/null 2>&1 || { echo "tok_http.sh: wrk not installed (make deps DEPS=wrk)"; exit 1; }
[ -x "$BIN" ] || { echo "tok_http.sh: $BIN missing (make)"; exit 1; }
[ -f "$root/$TOKREF/qwen3/tokenizer.json" ] || { echo "tok_http.sh: $TOKREF/qwen3 missing (make deps)"; exit 1; }

tmp=$(mktemp -d /tmp/kvr-bench-tokhttp.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# start NAME CACHE → sets PORT
start() {
    cat >"$tmp/$1.conf" <<EOF2
[log]
level = warn
[events]
bind = tcp://127.0.0.1:*
writer_threads = 1
[http]
listen = 127.0.0.1:0
threads = 1
[tokenizer]
prefix_cache = $2
[model "bench/qwen3"]
tokenizer = $root/$TOKREF/qwen3
EOF2
    # the ready line is at info; warn hides it, so raise the level just for it
    sed -i 's/^level = warn/level = info/' "$tmp/$1.conf"
    "$BIN" -c "$tmp/$1.conf" 2>"$tmp/$1.log" &
    pids="$pids $!"
    i=0
    until grep -q "kvrouterd ready" "$tmp/$1.log"; do
        i=$((i + 1))
        [ $i -gt 200 ] && { echo "tok_http.sh: $1 did not start"; cat "$tmp/$1.log"; exit 1; }
        sleep 0.1
    done
    PORT=$(grep "kvrouterd ready" "$tmp/$1.log" | sed -n 's/.* http=[^ ]*:\([0-9]*\).*/\1/p')
}
start warm 64MiB
wport=$PORT
start cold 0
cport=$PORT

"$PYTHON" - "$root/tests/data/tok/doc20k.txt" "$wport" "$tmp" <<'EOF2'
import http.client, json, sys
doc = open(sys.argv[1], encoding="utf-8").read()
port, out = int(sys.argv[2]), sys.argv[3]
def tok(text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/tokenize", json.dumps({"model": "bench/qwen3", "prompt": text}),
              {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    return r["tokens"]
prompts, ids = [], []
for i in range(16):
    text = "Request %d of the benchmark.\n%s" % (i, doc)
    while len(tok(text)) < 8192:
        text += doc[:2000]
    # trim to about 8K tokens
    lo, hi = len(doc), len(text)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if len(tok(text[:mid])) < 8192: lo = mid
        else: hi = mid
    text = text[:hi]
    prompts.append(text)
    ids.append(tok(text))
with open(out + "/prompts.json", "w") as f:
    for p in prompts:
        f.write(json.dumps({"model": "bench/qwen3", "prompt": p}) + "\n")
with open(out + "/ids.json", "w") as f:
    for t in ids:
        f.write(json.dumps({"model": "bench/qwen3", "token_ids": t}) + "\n")
# raw chat bodies: 16 conversations of 10 turns (~3 KB each) as a gateway forwards them
words = doc.split()
with open(out + "/chat.json", "w") as f:
    for i in range(16):
        msgs = [{"role": "system", "content": "Conversation %d. You are a careful assistant." % i}]
        for t in range(9):
            msgs.append({"role": "user" if t % 2 == 0 else "assistant",
                         "content": " ".join(words[(t * 400 + i * 37) % 3000:][:560])})
        f.write(json.dumps({"model": "bench/qwen3", "messages": msgs, "max_tokens": 256,
                            "temperature": 0.7, "stream": True}) + "\n")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/tokenize", json.dumps({"model": "bench/qwen3", "messages": msgs}),
              {"Content-Type": "application/json"})
    print("chat bodies: %d tokens each (the last one)" % json.loads(c.getresponse().read())["count"])
print("16 prompts, %d-%d bytes, %d-%d tokens" % (min(map(len, prompts)), max(map(len, prompts)),
      min(map(len, ids)), max(map(len, ids))))
EOF2

runwrk() { # NAME PORT FILE → prints, sets RPS
    wrk -t1 -c"$CONNS" -d"${DUR}s" --timeout 10s -s "$here/wrk_score.lua" "http://127.0.0.1:$2" \
        -- "$3" json >"$tmp/wrk.out" 2>&1 || { cat "$tmp/wrk.out"; exit 1; }
    RPS=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' "$tmp/wrk.out")
    P50=$(sed -n 's/^LAT p50_us=\([0-9]*\).*/\1/p' "$tmp/wrk.out")
    P99=$(sed -n 's/^LAT .*p99_us=\([0-9]*\).*/\1/p' "$tmp/wrk.out")
    ERR=$(sed -n 's/^wrk_score: .*non-2xx \([0-9]*\).*/\1/p' "$tmp/wrk.out")
    echo "$1 $RPS $P50 $P99 $ERR" >>"$tmp/results"
}
: >"$tmp/results"
runwrk warmup "$wport" "$tmp/prompts.json" # every prompt cached once
runwrk warmup "$wport" "$tmp/chat.json"
r=0
while [ $r -lt "$ROUNDS" ]; do
    runwrk token_ids "$wport" "$tmp/ids.json"
    runwrk prompt_cold "$cport" "$tmp/prompts.json"
    runwrk prompt_warm "$wport" "$tmp/prompts.json"
    runwrk chat_cold "$cport" "$tmp/chat.json"
    runwrk chat_warm "$wport" "$tmp/chat.json"
    r=$((r + 1))
done
echo "POST /v1/score, 8K-token queries, one loop thread, $CONNS connections, ${DUR}s x $ROUNDS rounds (best):"
for n in token_ids prompt_cold prompt_warm chat_cold chat_warm; do
    grep "^$n " "$tmp/results" | sort -k2 -n -r | head -1 |
        awk '{ printf "  %-34s %8.0f req/s   p50 %7d us   p99 %7d us   non-2xx %s\n", $1, $2, $3, $4, $5 }'
done
hits=$(curl -s "http://127.0.0.1:$wport/metrics" | sed -n 's/^kvrouter_tokenizer_prefix_cache_hits_total \([0-9]*\)/\1/p')
echo "  (warm daemon: prefix cache hits $hits)"
