#!/bin/sh
# Event ingestion benchmark: simulated vLLM engines (bench_publisher, trace-driven) publish
# real wire-format batches into a fresh kvrouterd; reports sustained blocks/s applied with
# zero gaps and event lag p50/p99. Run by `make bench` (BUILD, PYTHON set) or by hand:
#   BUILD=build/release sh bench/ingest.sh
# Knobs: KVR_BENCH_TRACE, KVR_BENCH_EPOCHS, KVR_BENCH_ENGINES, KVR_BENCH_BLOCK_SIZE,
# KVR_BENCH_CACHE_BLOCKS, KVR_BENCH_WRITERS, KVR_BENCH_PACED_FRACTION, KVR_BENCH_PACED_SECONDS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILD:=build/release}"
: "${PYTHON:=/usr/bin/python3}"
cd "$here/.."
if [ ! -x "$BUILD/bench/bench_publisher" ]; then
    make --no-print-directory WERROR=1 "$BUILD/bench/bench_publisher" >/dev/null
fi
BUILD="$BUILD" exec "$PYTHON" "$here/ingest_bench.py"
