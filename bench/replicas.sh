#!/bin/sh
# Replicas and first contact: (1) what [events] forward costs the primary and how fast a
# replica fed by it keeps up (bench_publisher, trace-driven, full speed, into a primary with
# and without a forward socket and one replica); (2) how long a kvrouterd started after an
# engine needs to replay its history from seq 0 (first contact through bind_replay) for a
# full vLLM ring (10,000 batches), and whether it got all of it. Run by `make bench` (BUILD,
# PYTHON set) or by hand:  BUILD=build/release sh bench/replicas.sh
# Knobs: KVR_BENCH_TRACE, KVR_BENCH_ENGINES, KVR_BENCH_BLOCK_SIZE, KVR_BENCH_CACHE_BLOCKS,
# KVR_BENCH_RING (10000), KVR_BENCH_RUNS (3).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILD:=build/release}"
: "${PYTHON:=/usr/bin/python3}"
cd "$here/.."
if [ ! -x "$BUILD/bench/bench_publisher" ]; then
    make --no-print-directory WERROR=1 "$BUILD/bench/bench_publisher" >/dev/null
fi
BUILD="$BUILD" exec "$PYTHON" "$here/replicas_bench.py"
