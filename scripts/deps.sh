#!/bin/sh
# Installs the Debian packages named in $DEPS that are not installed yet.
# A no-op when everything is present; needs root (or exits 1 with a clear message) otherwise.
set -eu
missing=""
for p in $DEPS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "kvrouterd: missing Debian packages:$missing" >&2
    echo "kvrouterd: run 'make deps' as root (or: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "kvrouterd: installing missing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $missing
