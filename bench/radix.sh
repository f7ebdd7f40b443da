#!/bin/sh
# bench/radix.sh — the seed's radix-tree-vs-positional table (bench/bench_radix.c): Dynamo's
# RadixTree and ConcurrentRadixTree written as comparators, run next to the positional index
# on the seed's workload (1M blocks, depth 1024, 128 workers), printed beside the seed's
# published figures; fails if a tree's find answer differs from the index's. ~15 s, one core.
# Env: BUILD (default build/release); KVR_RADIX_ROUNDS (3), KVR_RADIX_ITERS (1000),
# KVR_RADIX_SIZE / KVR_RADIX_DEPTH / KVR_RADIX_WORKERS (shape), KVR_RADIX_COUNT=0 (leave out
# the RadixTree with Dynamo's later count shortcut), KVR_BENCH_SEED.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_radix" >/dev/null
echo "== bench_radix (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
"$BUILD/bench/bench_radix"
