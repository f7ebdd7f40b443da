#!/bin/sh
# bench/index.sh — positional index benchmark (bench/bench_index.c).
# Env: BUILD (default build/release), KVR_BENCH_SEQS / KVR_BENCH_BLOCKS / KVR_BENCH_WORKERS /
# KVR_BENCH_BIG_WORKERS / KVR_BENCH_QUERIES to shrink shapes, KVR_TRACE (trace path, "" to
# skip), KVR_TRACE_REQUESTS; KVR_BENCH_CALLGRIND=1 also runs a reduced find/store workload
# under callgrind and prints instructions per call (stable where timings are noisy).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_index" >/dev/null
export KVR_TRACE="${KVR_TRACE-$root/../shared/traces/synthetic_trace.jsonl}"
echo "== bench_index"
"$BUILD/bench/bench_index"
if [ "${KVR_BENCH_CALLGRIND:-0}" = 1 ] && command -v valgrind >/dev/null; then
    out=$(mktemp /tmp/kvr-callgrind.XXXXXX)
    # cg FN SEQS CALLS: one run collecting only inside kvr_index_FN (callees included): the
    # index is split over several files and inlines helpers from index_int.h, so
    # callgrind_annotate's per-file inclusive lines no longer add up to a function's cost.
    cg() {
        KVR_BENCH_SEQS=$2 KVR_BENCH_BIG_WORKERS=0 KVR_BENCH_QUERIES=500 KVR_TRACE= \
            valgrind --tool=callgrind --toggle-collect="kvr_index_$1" --callgrind-out-file="$out" \
            "$BUILD/bench/bench_index" >/dev/null 2>&1
        callgrind_annotate "$out" 2>/dev/null |
            awk -v fn="$1" -v calls="$3" '/PROGRAM TOTALS/ {
                ir = $1; gsub(",", "", ir)
                printf "  %-7s %12d instructions in %4d calls = %9.0f per call (%.0f per block)\n",
                       fn, ir, calls, ir / calls, ir / calls / 1024 }'
    }
    echo "== callgrind: 128 sequences x 1024 blocks, 128 workers, 500 finds per kind (no trace)"
    cg store 128 256
    cg remove 128 256
    cg find 128 1500
    echo "  (store/remove: one 1024-block sequence per call, 128 from empty + 128 churn;"
    echo "   find: 500 full hit + 500 half"
    echo "   hit + 500 miss at block 0, 1024 blocks each)"
    # With one sequence a worker the churn empties each map (its remove frees it), so the
    # lines above never see a map with tombstones; two a worker keep maps half full through
    # the churn, as in the full shape (docs/index.md, steady state).
    cg store 256 512
    cg remove 256 512
    echo "  (256 sequences, two a worker: stores 256 from empty + 256 churn, removes 256"
    echo "   churn + 256 to empty; the maps keep records and tombstones through the churn)"
    rm -f "$out"
fi
