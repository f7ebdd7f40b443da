#!/bin/sh
# Puts promtool (Prometheus' rule and metrics checker) at $1, taken from Debian's prometheus
# package without installing it: `apt-get download` (19 MB) and `dpkg-deb -x` of the one
# binary. Installing the package would add a 96 MB Prometheus server, a system user and a
# service to a test machine for the 48 MB checker that
# tests/integration/test_observability.py runs on deploy/prometheus/kvrouterd-alerts.yml and
# the dashboard's queries. A no-op when $1 exists. Needs the Debian archive (as `make deps`).
# A second argument takes another binary of the package instead (scripts/dashboard-demo.py
# runs the Prometheus server itself: `promtool-fetch.sh build/tools/prometheus prometheus`).
set -eu
out=${1:?usage: promtool-fetch.sh OUT [promtool|prometheus]}
bin=${2:-promtool}
[ -x "$out" ] && exit 0
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp" # apt-get download runs as _apt where it can
if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update >/dev/null
    fi
    (cd "$tmp" && apt-get download prometheus)
fi
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
install -m 0755 "$tmp/x/usr/bin/$bin" "$out"
echo "kvrouterd: $out from $(basename "$tmp"/prometheus_*.deb)"
