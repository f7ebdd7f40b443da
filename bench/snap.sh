#!/bin/sh
# bench/snap.sh — snapshots (bench/bench_snap.c): take, write, load time and bytes per
# (holder, block) at 1M and 10M pairs; find latency while snapshots are taken vs without.
# Env: KVR_BENCH_SNAP_PAIRS ("1000000 10000000"), KVR_BENCH_SNAP_WORKERS, KVR_BENCH_SNAP_LEN,
# KVR_BENCH_SNAP_SHARED, KVR_BENCH_SNAP_DIR (where the file is written; default /tmp).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_snap" >/dev/null
echo "== bench_snap"
"$BUILD/bench/bench_snap"
