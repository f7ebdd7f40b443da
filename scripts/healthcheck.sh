#!/bin/bash
# Container health probe: GET /healthz on the scoring listener named by the configuration
# ([http] listen), so the probe follows the configured port. Installed in the image as
# /usr/local/bin/kvrouterd-healthcheck and used by the Dockerfile's HEALTHCHECK.
#
#   kvrouterd-healthcheck [CONFIG]   (default: $KVR_CONFIG, else /etc/kvrouterd/kvrouterd.conf)
#
# Exit 0 when the daemon answers 200, 1 otherwise (with the reason on stderr). A wildcard
# address (0.0.0.0, [::]) is probed on the loopback of the same family. Port 0 (a free port
# chosen at start) cannot be probed from the file: configure a fixed port in containers.
# Only bash builtins and coreutils' timeout: the runtime image has no HTTP client.
set -u
conf=${1:-${KVR_CONFIG:-/etc/kvrouterd/kvrouterd.conf}}
timeout_s=${KVR_HEALTHCHECK_TIMEOUT:-3}

# [http] listen as inih reads it: "key = value" or "key: value", ';'/'#' comment lines,
# ' ;' inline comments; the last assignment wins. Not set = the daemon's default.
listen=""
section=""
if [[ ! -r $conf ]]; then
    echo "kvrouterd-healthcheck: cannot read $conf" >&2
    exit 1
fi
while IFS= read -r line || [[ -n $line ]]; do
    line=${line%$'\r'}
    line="${line#"${line%%[![:space:]]*}"}"
    [[ -z $line || $line == \;* || $line == \#* ]] && continue
    if [[ $line =~ ^\[([^]]*)\] ]]; then
        section=${BASH_REMATCH[1]}
        section="${section#"${section%%[![:space:]]*}"}"
        section="${section%"${section##*[![:space:]]}"}"
        continue
    fi
    [[ $section == http ]] || continue
    if [[ $line =~ ^listen[[:space:]]*[=:][[:space:]]*(.*)$ ]]; then
        v=${BASH_REMATCH[1]}
        v=${v%%[[:space:]];*}
        v="${v%"${v##*[![:space:]]}"}"
        listen=$v
    fi
done <"$conf"
listen=${listen:-0.0.0.0:8080}

if [[ $listen =~ ^\[(.*)\]:([0-9]+)$ ]]; then
    host=${BASH_REMATCH[1]} port=${BASH_REMATCH[2]}
    [[ $host == "::" ]] && host="::1"
elif [[ $listen =~ ^([^:]+):([0-9]+)$ ]]; then
    host=${BASH_REMATCH[1]} port=${BASH_REMATCH[2]}
    [[ $host == 0.0.0.0 ]] && host=127.0.0.1
else
    echo "kvrouterd-healthcheck: cannot parse [http] listen = $listen in $conf" >&2
    exit 1
fi
if ((port == 0)); then
    echo "kvrouterd-healthcheck: [http] listen has port 0 in $conf; configure a fixed port" >&2
    exit 1
fi

# shellcheck disable=SC2016
timeout "$timeout_s" bash -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n" >&3
    read -r status <&3 || exit 1
    [[ $status == *" 200 "* ]] || { echo "kvrouterd-healthcheck: $1:$2 answered: ${status%$'"'"'\r'"'"'}" >&2; exit 1; }
' healthcheck "$host" "$port"
rc=$?
((rc == 0)) || echo "kvrouterd-healthcheck: GET /healthz on $host:$port failed" >&2
exit $((rc == 0 ? 0 : 1))
