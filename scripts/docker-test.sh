#!/usr/bin/env bash
# make docker-test: builds the Dockerfile and runs the image, without a Docker engine.
#
#   1. debootstrap a minbase Debian rootfs (cached as build/docker/debian-<release>.tar) and
#      import it as debian:<release> and debian:<release>-slim (nothing comes from a registry);
#   2. buildah bud --format docker (HEALTHCHECK exists only in the Docker image format)
#      --isolation chroot --network host: the build stage runs -Werror, unit tests and the
#      fuzz-corpus replay, as in `docker build`;
#   3. checks the image: HEALTHCHECK and user set, DEBIAN_FRONTEND not in its environment,
#      the runtime packages are exactly those providing the libraries the binary links;
#   4. podman --runtime runc run with a mounted configuration on other ports than the
#      defaults: GET /healthz answers 200 from the host, the image's HEALTHCHECK (podman
#      healthcheck run) passes on that port, SIGTERM (podman stop) ends it with exit 0.
#
# Needs root and Debian's debootstrap, buildah, podman, runc (installed via scripts/deps.sh).
# Image storage lives in build/docker/ too (podman/buildah --root), not in /var/lib/containers.
# Env: DOCKERFILE (Dockerfile), DEBIAN_RELEASE (bookworm), DEBIAN_MIRROR (default: the
# host's apt mirror), STORAGE_DRIVER (overlay; vfs works everywhere, slower), KEEP=1 keeps
# the container and image, REUSE=1 tests a kept image without rebuilding it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

REL=${DEBIAN_RELEASE:-bookworm}
DOCKERFILE=${DOCKERFILE:-Dockerfile}
CACHE=$REPO/build/docker
IMAGE=localhost/kvrouterd:docker-test
NAME=kvrouterd-docker-test-$$
PY=${PYTHON:-/usr/bin/python3}
now() { date +%s; }
T0=$(now)
say() { echo "== docker-test [$(($(now) - T0))s] $*"; }
die() { echo "docker-test: FAIL: $*" >&2; exit 1; }
FAILS=0
fail() { echo "docker-test: FAIL: $*" >&2; FAILS=$((FAILS + 1)); }  # checks: go on, fail at the end

[[ $(id -u) == 0 ]] || die "needs root (debootstrap, buildah and podman run as root here)"
DEPS="debootstrap buildah podman runc" sh scripts/deps.sh

if [[ -z ${DEBIAN_MIRROR:-} ]]; then
    DEBIAN_MIRROR=$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*debian\)\/*$/\1/p' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    [[ -n $DEBIAN_MIRROR ]] || DEBIAN_MIRROR=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' \
        /etc/apt/sources.list 2>/dev/null)
    [[ -n $DEBIAN_MIRROR ]] || die "no Debian mirror found in /etc/apt/sources*; set DEBIAN_MIRROR"
fi

mkdir -p "$CACHE"
ST=(--root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
PODMAN=(podman "${ST[@]}" --runtime runc --events-backend file)
[[ -d /run/systemd/system ]] || PODMAN+=(--cgroup-manager cgroupfs)
BUILDAH=(buildah "${ST[@]}")
# podman 4.3 tries to arm a systemd timer for a HEALTHCHECK and logs an error where systemd
# is not running (containers, CI); the check itself runs with `podman healthcheck run`.
podman_() { "${PODMAN[@]}" "$@" 2> >(grep -v -e 'systemd connection' >&2); }
# The runtimes' default limits (1048576 files, the host's process limit) cannot be applied
# on every host (a VM whose hard limits are lower, a runtime that lowers them first): pass
# ours explicitly, within the host's hard limits. Env NOFILE / NPROC override.
hn=$(ulimit -Hn) hu=$(ulimit -Hu)
NOFILE=${NOFILE:-$([[ $hn == unlimited ]] || ((hn > 65536)) && echo 65536 || echo "$hn")}
NPROC=${NPROC:-$([[ $hu == unlimited ]] || ((hu > 4096)) && echo 4096 || echo "$hu")}
ULIMITS=(--ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC")

# ---- 1. base image ---------------------------------------------------------------------
TAR=$CACHE/debian-$REL.tar
if [[ ! -s $TAR ]]; then
    say "debootstrap --variant=minbase $REL from $DEBIAN_MIRROR (cached in $TAR)"
    rm -rf "$CACHE/rootfs"
    debootstrap --variant=minbase "$REL" "$CACHE/rootfs" "$DEBIAN_MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 30 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
    tar -C "$CACHE/rootfs" --numeric-owner -cf "$TAR.tmp" .
    mv "$TAR.tmp" "$TAR"
    rm -rf "$CACHE/rootfs"
fi
if ! "${PODMAN[@]}" image exists "docker.io/library/debian:$REL"; then
    say "importing $TAR as debian:$REL and debian:$REL-slim"
    "${PODMAN[@]}" import -q "$TAR" "docker.io/library/debian:$REL" >/dev/null
fi
"${PODMAN[@]}" tag "docker.io/library/debian:$REL" "docker.io/library/debian:$REL-slim"

# ---- 2. build --------------------------------------------------------------------------
if [[ ${REUSE:-0} == 1 ]] && "${PODMAN[@]}" image exists "$IMAGE"; then
    say "REUSE=1: testing the existing $IMAGE"
else
say "buildah bud --format docker (build stage: -Werror build, unit tests, fuzz replay)"
"${BUILDAH[@]}" bud --isolation chroot --network host --format docker --pull=never \
    "${ULIMITS[@]}" \
    --build-arg DEBIAN_RELEASE="$REL" \
    --build-arg GIT_REV="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --layers=false -t "$IMAGE" -f "$DOCKERFILE" . >"$CACHE/build.log" 2>&1 \
    || { tail -n 40 "$CACHE/build.log" >&2; die "image build failed (log: $CACHE/build.log)"; }
say "built $IMAGE ($("${PODMAN[@]}" image inspect -f '{{.Size}}' "$IMAGE") bytes)"
fi

# ---- 3. image checks -------------------------------------------------------------------
insp() { "${PODMAN[@]}" image inspect -f "$1" "$IMAGE"; }
[[ $(insp '{{.Config.User}}') == kvrouterd:kvrouterd ]] || fail "image user is not kvrouterd"
hc=$(insp '{{json .Config.Healthcheck}}')
[[ $hc == *'"Test":'* ]] || fail "no HEALTHCHECK in the image (built without --format docker?): $hc"
env_=$(insp '{{json .Config.Env}}')
[[ $env_ != *DEBIAN_FRONTEND* ]] || fail "DEBIAN_FRONTEND leaks into the image environment: $env_"
# Runtime packages = packages owning the libraries the binary links directly (its NEEDED
# entries, read on the host: the runtime image has no binutils), libc6 aside.
listed=$(awk '/^FROM .* AS runtime/ {rt = 1} rt && /apt-get install/ {on = 1; next}
              on && /&&/ {on = 0} on { for (i = 1; i <= NF; i++)
                  if ($i ~ /^[a-z0-9][a-z0-9.+-]+$/) print $i }' "$DOCKERFILE" | sort -u)
cid=$(podman_ create "${ULIMITS[@]}" "$IMAGE")
"${PODMAN[@]}" cp "$cid:/usr/local/bin/kvrouterd" "$CACHE/kvrouterd.image" >/dev/null
podman_ rm "$cid" >/dev/null
sonames=$(objdump -p "$CACHE/kvrouterd.image" | awk '$1 == "NEEDED" {print $2}')
needed=$(podman_ run --rm --network none "${ULIMITS[@]}" --entrypoint /bin/sh "$IMAGE" -c '
    ldd /usr/local/bin/kvrouterd | awk "/not found/ {print \"MISSING:\" \$1}"
    for so in '"$(echo $sonames)"'; do
        p=$(ldconfig -p | awk -v so="$so" "\$1 == so {print \$NF; exit}")
        [ -n "$p" ] || { echo "MISSING:$so"; continue; }
        dpkg -S "$(readlink -f "$p")" 2>/dev/null | head -n1 | cut -d: -f1 |
            grep . || dpkg -S "$p" | head -n1 | cut -d: -f1
    done' | grep -v -x -e libc6 | sort -u)
[[ $needed != *MISSING:* ]] || fail "libraries not found in the runtime image: $needed"
[[ $listed == "$needed" ]] || fail "runtime packages in the Dockerfile ($(echo $listed)) differ from what the binary links ($(echo $needed))"
say "image checked: user, HEALTHCHECK, DEBIAN_FRONTEND, runtime packages vs linked libraries ($(echo $needed))"

# ---- 4. run ----------------------------------------------------------------------------
read -r P_HTTP P_ADMIN P_EV < <("$PY" -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
CONF=$CACHE/test.conf
sed -e "s|^listen = .*|listen = 0.0.0.0:$P_HTTP|" \
    -e "s|^admin_listen = .*|admin_listen = 127.0.0.1:$P_ADMIN|" \
    -e "s|^bind = .*|bind = tcp://127.0.0.1:$P_EV|" conf/kvrouterd.conf >"$CONF"
grep -q "^listen = 0.0.0.0:$P_HTTP\$" "$CONF" || die "could not set the port in $CONF"
cleanup() {
    if [[ ${KEEP:-0} != 1 ]]; then
        podman_ rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
        "${PODMAN[@]}" rmi -f "$IMAGE" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
say "podman run (host network, scoring API on :$P_HTTP instead of 8080)"
# --health-interval disable: no systemd timer (none here); podman healthcheck run runs it.
podman_ run -d --name "$NAME" --network host "${ULIMITS[@]}" --health-interval disable \
    -v "$CONF:/etc/kvrouterd/kvrouterd.conf:ro" "$IMAGE" >/dev/null
healthz() {
    timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$P_HTTP"' &&
        printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && read -r s <&3 && [[ $s == *" 200 "* ]]' 2>/dev/null
}
ok=0
for _ in $(seq 1 100); do
    if healthz; then ok=1; break; fi
    [[ $("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME") == true ]] || break
    sleep 0.2
done
((ok)) || { "${PODMAN[@]}" logs "$NAME" >&2 || true; die "GET /healthz on :$P_HTTP never answered 200"; }
say "GET /healthz -> 200 from the host"
if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null; then
    say "HEALTHCHECK (podman healthcheck run) passes on the configured port"
else
    fail "the image's HEALTHCHECK failed with the scoring API on port $P_HTTP"
fi
podman_ stop -t 10 "$NAME" >/dev/null
code=$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$NAME")
logs=$("${PODMAN[@]}" logs "$NAME" 2>&1)
[[ $code == 0 ]] || { echo "$logs" >&2; die "exit status $code after SIGTERM"; }
[[ $logs == *"received SIGTERM"* ]] || { echo "$logs" >&2; die "no SIGTERM in the logs"; }
say "SIGTERM -> exit 0"
((FAILS == 0)) || die "$FAILS check(s) failed"
say "passed in $(($(now) - T0))s"
