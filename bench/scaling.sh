#!/bin/sh
# bench/scaling.sh — what a second thread buys on this machine (bench/scaling_bench.py):
# ingestion over ZeroMQ with [events] writer_threads 1 and 2 (block ops/s), and POST
# /v1/score with [http] threads 1 and 2 (req/s; wrk with 1 and 2 threads), interleaved
# rounds, medians. The 2 cores are shared with the load generators. ~3-4 minutes.
# Env: BUILD, PYTHON, SCALING_ROUNDS (3), SCALING_HTTP_SECONDS (5), SCALING_HTTP_CONNS (32),
# KVR_BENCH_* as bench/ingest.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILD:=build/release}"
: "${PYTHON:=/usr/bin/python3}"
cd "$here/.."
make --no-print-directory WERROR=1 all "$BUILD/bench/bench_publisher" >/dev/null
BUILD="$BUILD" exec "$PYTHON" "$here/scaling_bench.py"
