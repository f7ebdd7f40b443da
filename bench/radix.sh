#!/bin/sh
# bench/radix.sh — the seed's radix-tree-vs-positional table (bench/bench_radix.c): Dynamo's
# RadixTree and ConcurrentRadixTree written as comparators, run next to the positional index
# on the seed's workload (1M blocks, depth 1024, 128 workers), printed beside the seed's
# published figures; fails if a tree's find answer differs from the index's. ~15-60 s (the
# machine's load), one core but for the concurrent-reader row. Notes: docs/radix.md.
# Env: BUILD (default build/release); KVR_RADIX_ROUNDS (3), KVR_RADIX_ITERS (1000),
# KVR_RADIX_SIZE / KVR_RADIX_DEPTH / KVR_RADIX_WORKERS (shape), KVR_RADIX_COUNT=0 (leave out
# the RadixTree with Dynamo's later count shortcut), KVR_BENCH_SEED.
# KVR_BENCH_CALLGRIND=1 also runs the benchmark under callgrind with its cache simulation
# (a 32 MB, 16-way last-level cache: valgrind's own guess on this VM is 512 MB) and prints,
# per structure, instructions and first-level / last-level data-read misses per timed call
# (load-independent where the timings are not); KVR_RADIX_CG_SIZE (default 1000000 pairs)
# and KVR_RADIX_CG_ITERS (1000: every sequence visited, as in the timed run) size that run
# (~12 minutes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build/release}
cd "$root"
make --no-print-directory "$BUILD/bench/bench_radix" >/dev/null
echo "== bench_radix (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
"$BUILD/bench/bench_radix"
if [ "${KVR_BENCH_CALLGRIND:-0}" = 1 ] && command -v valgrind >/dev/null; then
    dir=$(mktemp -d /tmp/kvr-radix-cg.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
    size=${KVR_RADIX_CG_SIZE:-1000000}
    iters=${KVR_RADIX_CG_ITERS:-1000}
    echo "== callgrind, cache simulation: $size pairs, $iters timed calls of each kind per structure"
    KVR_RADIX_SIZE=$size KVR_RADIX_ITERS=$iters KVR_RADIX_ROUNDS=1 KVR_RADIX_TAG=1 \
        valgrind --tool=callgrind --cache-sim=yes --LL=33554432,16,64 \
        --callgrind-out-file="$dir/cg.%p" --toggle-collect=cg_store \
        --toggle-collect=cg_remove_head --toggle-collect=cg_remove_tail \
        --toggle-collect=cg_find_hit --toggle-collect=cg_find_partial \
        "$BUILD/bench/bench_radix" >"$dir/stdout" 2>"$dir/stderr" ||
        { tail -20 "$dir/stderr"; exit 1; }
    printf '  %-16s %-12s %12s %10s %10s   (per call)\n' structure call instructions D1-misses LL-misses
    sed -n 's/^bench_radix: child \([0-9]*\) runs \(.*\)$/\1 \2/p' "$dir/stderr" |
    while read -r pid name; do
        # callgrind_annotate's inclusive lines: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw fn
        callgrind_annotate --inclusive=yes "$dir/cg.$pid" 2>/dev/null |
            awk -v name="$name" -v n="$iters" '/:cg_[a-z_]+ \[/ {
                v[1] = 0
                k = 0
                for (i = 1; i <= NF && k < 9; i++) {
                    if ($i ~ /^\(/ || $i ~ /%\)$/) continue
                    x = $i; gsub(",", "", x); if (x == ".") x = 0
                    v[++k] = x
                }
                fn = $0; sub(/.*:cg_/, "", fn); sub(/ .*/, "", fn)
                o = index("store remove_head remove_tail find_hit find_partial", fn)
                printf "%03d  %-16s %-12s %12.0f %10.0f %10.0f\n", o, name, fn, v[1] / n,
                       v[5] / n, v[8] / n
            }' | sort -n | cut -c4-
    done
fi
