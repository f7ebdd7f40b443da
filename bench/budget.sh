#!/bin/sh
# Memory cap benchmark: what the cap's per-store check costs (bench_budget: kvr_index_bytes
# against kvr_index_stats), then the Mooncake trace replayed by simulated vLLM engines into
# kvrouterd without a cap and with [index] max_memory at half the uncapped growth: index
# bytes over time against the cap, stores refused, stream states, peak RSS, /v1/score
# answering throughout (budget_bench.py). Run by `make bench` (BUILD, PYTHON set) or by hand:
#   BUILD=build/release sh bench/budget.sh
# Knobs: KVR_BENCH_TRACE, KVR_BENCH_EPOCHS, KVR_BENCH_ENGINES, KVR_BENCH_BLOCK_SIZE,
# KVR_BENCH_CACHE_BLOCKS, KVR_BENCH_WRITERS; KVR_BENCH_READERS, KVR_BENCH_CALLS (bench_budget).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILD:=build/release}"
: "${PYTHON:=/usr/bin/python3}"
cd "$here/.."
make --no-print-directory WERROR=1 "$BUILD/kvrouterd" "$BUILD/bench/bench_publisher" \
    "$BUILD/bench/bench_budget" >/dev/null
echo "== bench_budget"
"$BUILD/bench/bench_budget"
echo "== trace replay under the cap"
BUILD="$BUILD" exec "$PYTHON" "$here/budget_bench.py"
