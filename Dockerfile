# kvrouterd container image.
#
#   docker build -t kvrouterd .
#   docker run --rm -p 5557:5557 -p 8080:8080 \
#       -v "$PWD/my.conf:/etc/kvrouterd/kvrouterd.conf:ro" kvrouterd
#
# Stage 1 installs the same Debian packages as `make deps` + the test tools (DEB_BUILD and
# DEB_TEST in the Makefile; keep the lists in sync), builds with -Werror and runs the unit
# tests and the fuzz-corpus replay. Stage 2 carries only the runtime libraries.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        build-essential pkg-config libzmq3-dev libmsgpack-dev libxxhash-dev libuv1-dev \
        libcjson-dev libhttp-parser-dev libinih-dev \
        libcmocka-dev python3 python3-pytest python3-zmq python3-msgpack \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# .git is not copied (.dockerignore); pass --build-arg GIT_REV=$(git rev-parse --short HEAD).
ARG GIT_REV=unknown
RUN make -j"$(nproc)" WERROR=1 GIT_REV="${GIT_REV}" all \
 && make WERROR=1 GIT_REV="${GIT_REV}" unit fuzz-replay \
 && build/release/kvrouterd -t -c conf/kvrouterd.conf

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libzmq5 libmsgpackc2 libxxhash0 libuv1 libcjson1 libhttp-parser2.9 libinih1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --user-group --no-create-home --home-dir /var/lib/kvrouterd \
        --shell /usr/sbin/nologin kvrouterd \
 && install -d -o kvrouterd -g kvrouterd -m 0750 /var/lib/kvrouterd
COPY --from=build /src/build/release/kvrouterd /usr/local/bin/kvrouterd
# The default configuration; mount your own file over it (read-only is fine).
COPY --from=build /src/conf/kvrouterd.conf /etc/kvrouterd/kvrouterd.conf
USER kvrouterd:kvrouterd
WORKDIR /var/lib/kvrouterd
# 5557: ZeroMQ KV-cache events from vLLM (bind mode); 8080: scoring HTTP API.
# The admin listener (8081) stays on the container's loopback in the default config.
EXPOSE 5557 8080
# bash's /dev/tcp: no HTTP client needed in the image. Healthy = GET /healthz answers 200.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r status <&3 && [[ $status == *' 200 '* ]]"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvrouterd"]
CMD ["-c", "/etc/kvrouterd/kvrouterd.conf"]
