#!/bin/sh
# Runs every bench/*.sh except this one, in name order. Called by `make bench` with BUILD
# (build/<variant>) and PYTHON in the environment; each benchmark prints its own results.
# Exits non-zero if any benchmark fails (after running the others).
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILD:=build/release}"
: "${PYTHON:=/usr/bin/python3}"
export BUILD PYTHON

n=0
failed=""
for b in "$here"/*.sh; do
    [ -e "$b" ] || continue
    name=$(basename "$b")
    [ "$name" = "run.sh" ] && continue
    n=$((n + 1))
    echo "================================================================================"
    echo "== benchmark: ${name%.sh}    ($(date -u +%Y-%m-%dT%H:%M:%SZ), BUILD=$BUILD)"
    echo "================================================================================"
    start=$(date +%s)
    if sh "$b"; then
        echo "== ${name%.sh}: ok ($(( $(date +%s) - start )) s)"
    else
        rc=$?
        echo "== ${name%.sh}: FAILED with status $rc ($(( $(date +%s) - start )) s)"
        failed="$failed ${name%.sh}"
    fi
done
if [ "$n" -eq 0 ]; then
    echo "bench: no benchmarks yet (add bench/<name>.sh)"
    exit 0
fi
if [ -n "$failed" ]; then
    echo "bench: failed:$failed" >&2
    exit 1
fi
echo "bench: $n benchmark(s) ok"
