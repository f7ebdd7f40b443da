#!/bin/sh
# bench/index_dump.sh — a worker's dump and restore, the index's part of a snapshot
# (bench/bench_index_dump.c): time, pairs/s and bytes per (holder, block) pair at ~1M and ~10M
# pairs. Env: BUILD (default build/release), KVR_BENCH_PAIRS (default "1000000,10000000"),
# KVR_BENCH_WORKERS (128), KVR_BENCH_BLOCKS (1024), KVR_BENCH_REPS (5), KVR_BENCH_SEED.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_index_dump" >/dev/null
echo "== bench_index_dump"
"$BUILD/bench/bench_index_dump"
