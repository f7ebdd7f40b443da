#!/bin/sh
# bench/floor.sh — the floor of an index store's per-block work (bench/bench_floor.c), to
# read next to bench_index's "store (per sequence, from empty)" line. One core, ~1.5 s.
# Env: BUILD (default build/release); KVR_BENCH_SEQS / KVR_BENCH_BLOCKS / KVR_BENCH_WORKERS
# (shape, as bench/index.sh), KVR_BENCH_SEED; KVR_FLOOR_ONLY (run only the variants whose
# name starts with it, e.g. "(e) (c)").
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_floor" >/dev/null
echo "== bench_floor"
"$BUILD/bench/bench_floor"
