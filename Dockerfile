# kvrouterd container image.
#
#   docker build -t kvrouterd .
#   docker run --rm -p 5557:5557 -p 8080:8080 \
#       -v "$PWD/my.conf:/etc/kvrouterd/kvrouterd.conf:ro" kvrouterd
#
# HEALTHCHECK is part of the Docker image format only: with buildah/podman build with
# `--format docker` (the OCI format drops it). `make docker-test` builds and runs this file
# with buildah + podman (scripts/docker-test.sh).
#
# Stage 1 installs the same Debian packages as `make deps` + the test tools (DEB_BUILD and
# DEB_TEST in the Makefile; keep the lists in sync), builds with -Werror and runs the unit
# tests and the fuzz-corpus replay. Stage 2 carries only the runtime libraries.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
# An ARG, not an ENV: it applies to these RUN lines and does not leak into the image.
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        build-essential pkg-config libzmq3-dev libmsgpack-dev libxxhash-dev libuv1-dev \
        libhttp-parser-dev libinih-dev libcjson-dev libpcre2-dev libutf8proc-dev \
        libcurl4-openssl-dev \
        libcmocka-dev python3 python3-pytest python3-zmq python3-msgpack \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# .git is not copied (.dockerignore); pass --build-arg GIT_REV=$(git rev-parse --short HEAD).
ARG GIT_REV=unknown
RUN make -j"$(nproc)" WERROR=1 GIT_REV="${GIT_REV}" all \
 && KVR_TOK_NO_REF=1 make WERROR=1 GIT_REV="${GIT_REV}" unit fuzz-replay \
 && install -d /var/lib/kvrouterd \
 && build/release/kvrouterd -t -c conf/kvrouterd.conf

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG DEBIAN_FRONTEND=noninteractive
# Exactly the libraries the binary links (objdump -p build/release/kvrouterd | grep NEEDED);
# scripts/docker-test.sh checks the list against the built binary.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libzmq5 libmsgpackc2 libxxhash0 libuv1 libhttp-parser2.9 libinih1 \
        libcjson1 libpcre2-8-0 libutf8proc2 libcurl4 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --user-group --no-create-home --home-dir /var/lib/kvrouterd \
        --shell /usr/sbin/nologin kvrouterd \
 && install -d -o kvrouterd -g kvrouterd -m 0750 /var/lib/kvrouterd
COPY --from=build /src/build/release/kvrouterd /usr/local/bin/kvrouterd
# The default configuration; mount your own file over it (read-only is fine).
COPY --from=build /src/conf/kvrouterd.conf /etc/kvrouterd/kvrouterd.conf
COPY --from=build /src/scripts/healthcheck.sh /usr/local/bin/kvrouterd-healthcheck
USER kvrouterd:kvrouterd
WORKDIR /var/lib/kvrouterd
# [state] dir of the shipped configuration: snapshots survive the container when a volume is
# mounted here (docker run -v kvrouterd-state:/var/lib/kvrouterd ...).
VOLUME /var/lib/kvrouterd
# 5557: ZeroMQ KV-cache events from vLLM (bind mode); 8080: scoring HTTP API.
# The admin listener (8081) stays on the container's loopback in the default config.
EXPOSE 5557 8080
# Healthy = GET /healthz on the port of [http] listen in the configuration answers 200
# (kvrouterd-healthcheck reads the file, so a mounted config with another port is followed;
# bash's /dev/tcp, no HTTP client in the image). A config at another path: set KVR_CONFIG.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/kvrouterd-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvrouterd"]
CMD ["-c", "/etc/kvrouterd/kvrouterd.conf"]
