# kvrouterd — plain GNU make, dependencies through pkg-config.
#
#   make            build the daemon (build/kvrouterd)
#   make test       install missing Debian packages, build with -Werror, run unit,
#                   integration and fuzz-corpus-replay tests
#   make run        deps (+ the quick start's python3-zmq/-msgpack) + build + run in the
#                   foreground on conf/kvrouterd.conf, snapshots in run/state (feed it:
#                   scripts/publish-demo.py)
#   make bench      build and run the benchmarks (bench/run.sh)
#   make fuzz       clang libFuzzer builds, time-boxed runs (FUZZ_SECONDS, default 60 each)
#   make soak       the long fault campaign (tests/soak/soak.py, SOAK_SECONDS, default 1800;
#                   not in make test): kills, restarts, replays, bootstrap, checked scores
#   make install    PREFIX=/usr/local DESTDIR= (keeps an existing /etc/kvrouterd/kvrouterd.conf)
#   make docker-test build the Dockerfile with buildah and run it with podman (as root)
#   make SANITIZE=address,undefined ... / make SANITIZE=thread ...
#
# Every src/<subsystem>/*.c is a module compiled into build/<variant>/libkvr.a; tests/unit/test_*.c,
# tests/fuzz/fuzz_*.c and bench/bench_*.c are discovered by name, so adding a module or a
# test needs no edit here.

PREFIX     ?= /usr/local
DESTDIR    ?=
SYSCONFDIR ?= /etc
UNITDIR    ?= /lib/systemd/system
PYTHON     ?= /usr/bin/python3
CC         ?= cc
SANITIZE   ?=
WERROR     ?= 0
FUZZ_SECONDS ?= 60

VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# Debian packages: build/runtime libraries, test tools. Kept in sync with the Dockerfile.
# The daemon links exactly the libraries of DEB_BUILD (+ libc/libm); the Dockerfile's runtime
# stage installs their runtime packages. cJSON loads tokenizer.json files (tok; the request
# path parses bodies with its own jtok, and bench_jtok compares against cJSON); PCRE2 runs
# the tokenizers' split regexes, utf8proc their Unicode normalizers; libcurl (OpenSSL
# flavour) scrapes the engines' /metrics ([load], docs/load.md says why a library).
DEB_BUILD := build-essential pkg-config libzmq3-dev libmsgpack-dev libxxhash-dev libuv1-dev \
             libhttp-parser-dev libinih-dev libcjson-dev libpcre2-dev libutf8proc-dev \
             libcurl4-openssl-dev
# The shipped gateways (deploy/nginx, deploy/haproxy): tests/integration/test_gateways.py and
# bench/gateways.sh run the real servers (`make test` / `make bench` install them; not in the
# Dockerfile, whose build stage runs no integration test).
DEB_GATEWAY := nginx-light libnginx-mod-http-js haproxy
DEB_TEST  := libcmocka-dev python3 python3-pytest python3-zmq python3-msgpack python3-jinja2 \
             python3-yaml \
             $(DEB_GATEWAY)
DEB_BENCH := wrk nginx-light
# What the README's quick start uses beside the daemon: scripts/publish-demo.py (an emulated
# vLLM engine, ZeroMQ + msgpack) and the msgpack query example (docs/http-api.md); `make run`
# installs them.
DEB_RUN   := python3 python3-zmq python3-msgpack
DEB_FUZZ  := clang libclang-rt-14-dev
DEPS      ?= $(DEB_BUILD)
PKGS      := libzmq msgpack libxxhash libuv inih libcjson libpcre2-8 libutf8proc libcurl
BENCH_PKGS :=

comma := ,
ifeq ($(SANITIZE),)
  VARIANT := release
  SANFLAGS :=
else
  VARIANT := san-$(subst $(comma),-,$(SANITIZE))
  SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
# A clang build lives beside the gcc one (build/<variant>-clang), so both can be kept.
ifneq ($(findstring clang,$(notdir $(CC))),)
  VARIANT := $(VARIANT)-clang
endif
BUILD := build/$(VARIANT)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wformat=2 -Wundef -Wno-unused-parameter
ifeq ($(WERROR),1)
  WARN += -Werror
endif
OPT ?= -O2
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser
CFLAGS_ALL  = -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) $(SANFLAGS) -pthread -Isrc $(PKG_CFLAGS) \
              -DKVR_VERSION='"$(VERSION)"' -DKVR_GIT_REV='"$(GIT_REV)"' $(CFLAGS)
LDFLAGS_ALL = $(SANFLAGS) -pthread $(LDFLAGS)
LIBS_ALL    = $(PKG_LIBS) -lm $(LIBS)

SRCS       := $(sort $(wildcard src/*.c src/*/*.c))
OBJS       := $(SRCS:src/%.c=$(BUILD)/src/%.o)
LIB        := $(BUILD)/libkvr.a
BIN        := $(BUILD)/kvrouterd
UNIT_SRCS  := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRCS  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz-replay/%)
BENCH_SRCS := $(sort $(wildcard bench/bench_*.c))
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

.PHONY: layers all deps deps-deb deps-tok deps-fuzz deps-test test unit integration fuzz-replay fuzz-replay-clang fuzz soak run bench install clean check-config docker-test
.DEFAULT_GOAL := all

# build/kvrouterd always points at the binary of the variant built last (tests use it).
all: $(BIN)
	@mkdir -p build
	@ln -sfn $(VARIANT)/kvrouterd build/kvrouterd

$(BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c -o $@ $<

$(BUILD)/daemon/%.o: daemon/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c -o $@ $<

$(LIB): $(OBJS)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(BUILD)/daemon/main.o $(LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

$(BUILD)/tests/%: tests/unit/%.c $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -Itests/unit -MMD -MP -o $@ $< $(LIB) $(LDFLAGS_ALL) $(LIBS_ALL) -lcmocka

$(BUILD)/fuzz-replay/%: tests/fuzz/%.c tests/fuzz/replay_main.c $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -o $@ $< tests/fuzz/replay_main.c $(LIB) $(LDFLAGS_ALL) $(LIBS_ALL)

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(shell pkg-config --cflags $(BENCH_PKGS) 2>/dev/null) -Ibench -MMD -MP \
	  -o $@ $< $(LIB) $(LDFLAGS_ALL) $(LIBS_ALL) $(shell pkg-config --libs $(BENCH_PKGS) 2>/dev/null)

-include $(OBJS:.o=.d) $(BUILD)/daemon/main.d

# ---- dependencies --------------------------------------------------------------------
# Installs whatever of $(DEPS) is missing, and fetches the reference tokenizers test_tok and
# bench/tok.sh use (npm, into $(TOKREF); scripts/tok-fetch.sh); a no-op when all are present.
TOKREF ?= build/tokref
deps: deps-deb deps-tok

deps-deb:
	@DEPS="$(DEPS)" sh scripts/deps.sh

deps-tok:
	@sh scripts/tok-fetch.sh $(TOKREF)

# clang and its sanitizer runtimes (make fuzz, and make test's clang replay uses them when present)
deps-fuzz:
	@DEPS="$(DEB_FUZZ)" sh scripts/deps.sh

# ---- tests ---------------------------------------------------------------------------
test:
	@$(MAKE) --no-print-directory deps DEPS="$(DEB_BUILD) $(DEB_TEST)"
	@$(MAKE) --no-print-directory layers
	@$(MAKE) --no-print-directory -j$(NPROC) WERROR=1 all $(UNIT_BINS) $(FUZZ_REPLAY)
	@$(MAKE) --no-print-directory WERROR=1 unit
	@$(MAKE) --no-print-directory WERROR=1 fuzz-replay
	@$(MAKE) --no-print-directory fuzz-replay-clang
	@$(MAKE) --no-print-directory $(PROMTOOL)
	@$(MAKE) --no-print-directory WERROR=1 integration

# promtool for test_observability.py (the alert rules and the dashboard's queries), taken
# out of Debian's prometheus package without installing it (scripts/promtool-fetch.sh says
# why); without it the test falls back on its own YAML and expression checks.
PROMTOOL := build/tools/promtool
$(PROMTOOL):
	@sh scripts/promtool-fetch.sh $@

# The folders of src/ are layers: no include runs upward (scripts/check-layers.py holds the map).
layers:
	@$(PYTHON) scripts/check-layers.py src

# ThreadSanitizer builds read tests/tsan.supp (libuv's uninstrumented closes; the file says
# why); other builds ignore TSAN_OPTIONS.
TSAN_ENV = TSAN_OPTIONS="$${TSAN_OPTIONS:+$$TSAN_OPTIONS }suppressions=$(CURDIR)/tests/tsan.supp"

# `make unit UNIT="test_a test_b"` runs only those.
NPROC := $(shell nproc 2>/dev/null || echo 2)
UNIT ?=
UNIT_RUN := $(if $(UNIT),$(UNIT:%=$(BUILD)/tests/%),$(UNIT_BINS))
unit: $(UNIT_RUN)
	@set -e; for t in $(UNIT_RUN); do echo "== $$t"; KVR_TOKREF=$(TOKREF) $(TSAN_ENV) $$t; done

fuzz-replay: $(FUZZ_REPLAY)
	@set -e; for t in $(FUZZ_REPLAY); do n=$$(basename $$t); \
	  echo "== $$n: replaying tests/fuzz/corpus/$${n#fuzz_}"; $$t tests/fuzz/corpus/$${n#fuzz_}; done

# The corpora once more under clang's ASan+UBSan, which sees what gcc's UBSan does not
# (pointer arithmetic on NULL, pointer wrap); any report halts (-fno-sanitize-recover=all via
# SANFLAGS). -O1 keeps the build short; skipped with a note when clang is not installed.
# Not -Werror: the gcc build is the one held to it (clang warns differently).
CLANG ?= clang
fuzz-replay-clang:
	@if command -v $(CLANG) >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory -j2 CC=$(CLANG) SANITIZE=address,undefined OPT=-O1 WERROR=1 fuzz-replay; \
	else echo "== fuzz-replay-clang: $(CLANG) not installed, skipped"; fi

integration: all
	KVR_BIN=$(abspath $(BIN)) KVR_PROMTOOL=$(abspath $(PROMTOOL)) $(TSAN_ENV) $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

# `make run` and check-config use the shipped configuration with [state] dir pointed at
# run/state under the checkout (git-ignored) instead of the unit's /var/lib/kvrouterd.
RUN_CONF := run/kvrouterd.conf
$(RUN_CONF): conf/kvrouterd.conf
	@mkdir -p run/state
	sed 's|^dir = /var/lib/kvrouterd$$|dir = $(CURDIR)/run/state|' conf/kvrouterd.conf > $@

check-config: all $(RUN_CONF)
	$(BIN) -t -c $(RUN_CONF)

# ---- run -----------------------------------------------------------------------------
run:
	@$(MAKE) --no-print-directory deps-deb DEPS="$(DEB_BUILD) $(DEB_RUN)"
	@$(MAKE) --no-print-directory all $(RUN_CONF)
	exec $(BIN) -c $(RUN_CONF)

# ---- benchmarks ----------------------------------------------------------------------
bench:
	@$(MAKE) --no-print-directory deps DEPS="$(DEB_BUILD) $(DEB_TEST) $(DEB_BENCH)"
	@$(MAKE) --no-print-directory all $(BENCH_BINS)
	BUILD=$(BUILD) PYTHON=$(PYTHON) sh bench/run.sh

# ---- soak (not in make test or CI) ---------------------------------------------------
# tests/soak/soak.py against this variant's binary (SANITIZE=address,undefined: the ASan+UBSan
# one); SOAK_ARGS passes more options (--seed N, --kill-every S, ...; --help lists them).
SOAK_SECONDS ?= 1800
SOAK_ARGS ?=
soak: all
	$(PYTHON) tests/soak/soak.py --bin $(BIN) --duration $(SOAK_SECONDS) $(SOAK_ARGS)

# ---- fuzzing (clang + libFuzzer) -----------------------------------------------------
FUZZ_BUILD := build/fuzz
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined \
               -fno-sanitize-recover=all -Isrc $(PKG_CFLAGS)
fuzz:
	@$(MAKE) --no-print-directory deps-deb DEPS="$(DEB_BUILD) $(DEB_FUZZ)"
	@mkdir -p $(FUZZ_BUILD)
	@set -e; for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); \
	  clang $(FUZZ_CFLAGS) -o $(FUZZ_BUILD)/$$n $$f $(SRCS) $(PKG_LIBS) -lm; \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$n; \
	  echo "== $$n for $(FUZZ_SECONDS)s"; \
	  $(FUZZ_BUILD)/$$n -max_total_time=$(FUZZ_SECONDS) $(FUZZ_BUILD)/corpus-$$n tests/fuzz/corpus/$${n#fuzz_}; \
	done

# ---- container -----------------------------------------------------------------------
# Builds the Dockerfile with buildah and runs the image with podman + runc (no Docker engine
# needed): scripts/docker-test.sh. Installs debootstrap/buildah/podman/runc; caches the base
# rootfs and the image storage under build/docker/.
docker-test:
	bash scripts/docker-test.sh

# ---- install -------------------------------------------------------------------------
# The configuration is an operator's file: installed only when absent. When one exists it
# is left as it is and the shipped file goes beside it as kvrouterd.conf.dist (to diff).
# INSTALL_BIN: the binary to install (tests install a given variant's with `make -o all`).
INSTALL_BIN ?= $(BIN)
CONF_DEST = $(DESTDIR)$(SYSCONFDIR)/kvrouterd/kvrouterd.conf
install: all
	install -D -m 0755 $(INSTALL_BIN) $(DESTDIR)$(PREFIX)/bin/kvrouterd
	@if [ -e "$(CONF_DEST)" ] || [ -L "$(CONF_DEST)" ]; then \
	  install -D -m 0644 conf/kvrouterd.conf "$(CONF_DEST).dist"; \
	  echo "kvrouterd: $(CONF_DEST) exists and was kept;" \
	       "the shipped configuration is installed as $(CONF_DEST).dist"; \
	else \
	  echo "install -D -m 0644 conf/kvrouterd.conf $(CONF_DEST)"; \
	  install -D -m 0644 conf/kvrouterd.conf "$(CONF_DEST)"; \
	fi
	sed 's|@BINDIR@|$(PREFIX)/bin|g; s|@SYSCONFDIR@|$(SYSCONFDIR)|g' systemd/kvrouterd.service \
	  > kvrouterd.service.tmp
	install -D -m 0644 kvrouterd.service.tmp $(DESTDIR)$(UNITDIR)/kvrouterd.service
	rm -f kvrouterd.service.tmp

clean:
	rm -rf build
