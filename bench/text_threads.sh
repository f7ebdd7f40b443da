#!/bin/sh
# text_threads.sh — what a large text costs the other requests of its loop, before and after
# the text threads (issue #27): /healthz and small /v1/score latency on the same listener
# while 1 MiB Gemma 3 prompts arrive back to back, and while 64 connections send 32 KiB Qwen3
# chat bodies; the cost of the hand-off for a 2 KiB prompt (it stays inline) and for larger
# ones; the time to refuse a 1 MiB prompt over max_query_tokens. bench/text_threads_bench.py
# has the details. One loop thread ([http] threads = 1), [tokenizer] threads = 1 (a 2-core
# machine: one core for the loop and the clients).
# Environment: BUILD, PYTHON, TOKREF (build/tokref), TEXT_SECONDS (5 per scenario),
# TEXT_BEFORE_BIN (a kvrouterd without text threads, e.g. main's build: measured in the same
# run, first).
set -eu
BUILD=${BUILD:-build/release}
PYTHON=${PYTHON:-/usr/bin/python3}
TOKREF=${TOKREF:-build/tokref}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BIN=${KVR_BIN:-$root/$BUILD/kvrouterd}
[ -x "$BIN" ] || { echo "text_threads.sh: $BIN missing (make)"; exit 1; }
[ -f "$root/$TOKREF/gemma3/tokenizer.json" ] || { echo "text_threads.sh: $TOKREF/gemma3 missing (make deps)"; exit 1; }
set --
if [ -n "${TEXT_BEFORE_BIN:-}" ]; then
    set -- "before=$TEXT_BEFORE_BIN"
fi
exec "$PYTHON" "$here/text_threads_bench.py" --tokref "$root/$TOKREF" \
    --seconds "${TEXT_SECONDS:-5}" "$@" "after=$BIN:tokenizer.threads=1"
