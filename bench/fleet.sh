#!/bin/sh
# fleet.sh — routing quality with kvrouterd in the loop, short version: 8 simulated vLLM
# engines (continuous batching, chunked prefill, prefix caches, real KV events over ZeroMQ
# to a real kvrouterd, real /metrics), the Mooncake trace and the hot-system-prompt
# workloads at ~80% of the fleet's round-robin capacity, four routers; prints TTFT
# p50/p90/p99 per router and the per-cell details, and fails when an engine's cache and
# kvrouterd's index disagree after a run. ~3 minutes on the 2-core development machine.
# The full matrix (all routers, three workloads, two load levels, 60 s cells) is the
# command in docs/routing.md. Environment: BUILD, PYTHON, KVR_TRACE; any fleet_sim.py
# option as arguments (they override the ones below), e.g. sh bench/fleet.sh --speed 0.5
set -eu
BUILD=${BUILD:-build/release}
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export KVR_BIN=${KVR_BIN:-$root/$BUILD/kvrouterd}
[ -x "$KVR_BIN" ] || { echo "fleet.sh: $KVR_BIN missing (make)"; exit 1; }
"$PYTHON" -c 'import zmq, msgpack' 2>/dev/null || { echo "fleet.sh: $PYTHON lacks zmq/msgpack (make deps)"; exit 1; }
workloads=mooncake,hot
if [ -z "${KVR_TRACE:-}" ]; then
    for t in "$root/../shared/traces/synthetic_trace.jsonl" /work/shared/traces/synthetic_trace.jsonl; do
        if [ -f "$t" ]; then KVR_TRACE=$t; break; fi
    done
fi
if [ -z "${KVR_TRACE:-}" ] || [ ! -f "$KVR_TRACE" ]; then
    echo "fleet.sh: no Mooncake trace (set KVR_TRACE): hot-prompt workload only"
    workloads=hot
    KVR_TRACE=/nonexistent
fi
export KVR_TRACE
exec "$PYTHON" "$here/fleet_sim.py" \
    --routers round-robin,least-loaded,kvrouterd-gw,dynamo \
    --workloads "$workloads" --loads 0.8 \
    --duration 30 --warmup 6 --speed 2 --trace-start 900 --drain 60 --validate-sample 100 \
    --json "$root/build/fleet/short.json" "$@"
