#!/bin/sh
# gateways.sh — the shipped gateways (deploy/nginx, deploy/haproxy) with kvrouterd vs the
# same gateway doing round-robin: the engines' prefix-cache hit rate on a Mooncake trace
# replay, requests/s and latency p50/p99 through the gateway (the difference is what the
# routing call adds). Real nginx + njs and HAProxy + Lua, simulated engines
# (tests/integration/engine_sim.py); see bench/gateways_bench.py for the setup.
# Environment: BUILD, PYTHON, and any gateways_bench.py option as arguments
# (e.g. sh bench/gateways.sh --requests 400 --seconds 8). The defaults (the whole trace,
# four replays) take ~8 minutes on the 2-core development machine.
set -eu
BUILD=${BUILD:-build/release}
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export KVR_BIN=${KVR_BIN:-$root/$BUILD/kvrouterd}
[ -x "$KVR_BIN" ] || { echo "gateways.sh: $KVR_BIN missing (make)"; exit 1; }
for t in nginx haproxy; do
    command -v $t >/dev/null 2>&1 || { echo "gateways.sh: $t not installed (make deps)"; exit 1; }
done
[ -f "$root/build/tokref/qwen3/tokenizer.json" ] || { echo "gateways.sh: build/tokref missing (make deps)"; exit 1; }
exec "$PYTHON" "$here/gateways_bench.py" "$@"
