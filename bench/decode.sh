#!/bin/sh
# Decoder throughput (bench/bench_decode.c), one core. Run by bench/run.sh with BUILD set;
# standalone: make build/release/bench/bench_decode && sh bench/decode.sh [seconds per case]
set -e
BUILD=${BUILD:-build/release}
echo "== decode throughput ($BUILD/bench/bench_decode)"
"$BUILD/bench/bench_decode" "${1:-1}"
