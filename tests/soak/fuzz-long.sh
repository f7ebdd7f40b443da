#!/bin/sh
# fuzz-long.sh — long libFuzzer runs with `make fuzz`'s flags (clang, -O1,
# -fsanitize=fuzzer,address,undefined, -fno-sanitize-recover=all), the sources compiled once
# into build/fuzz-long/obj instead of once per target. Not part of `make test`.
#
#   sh tests/soak/fuzz-long.sh build                 # objects + every target
#   sh tests/soak/fuzz-long.sh run TARGET SECONDS [RUNS]   # e.g. run fuzz_snap 600 10000000
#   FUZZ_ARGS="-max_len=512" sh tests/soak/fuzz-long.sh run ...  # more libFuzzer flags
#
# A run fuzzes build/fuzz-long/corpus-TARGET (new inputs land there) seeded with
# tests/fuzz/corpus/<TARGET without fuzz_>, stops after SECONDS or RUNS executions, and
# prints libFuzzer's last status line (#execs, cov, corp). Crashes go to
# build/fuzz-long/crash-TARGET-*; the log to build/fuzz-long/TARGET.log.
set -eu
cd "$(dirname "$0")/../.."
OUT=build/fuzz-long
vars=$(make -s --no-print-directory \
  --eval='fuzzvars: ; @echo "CF=\"$(FUZZ_CFLAGS)\""; echo "LIBS=\"$(PKG_LIBS)\""; echo "SRCS=\"$(SRCS)\""' \
  fuzzvars)
eval "$vars"
case "${1:-}" in
build)
  mkdir -p $OUT/obj
  for s in $SRCS; do echo "$s"; done | \
    xargs -P "${JOBS:-2}" -I{} sh -c 'o='$OUT'/obj/$(echo {} | tr / _).o;
      [ "$o" -nt {} ] || clang '"$CF"' -c -o "$o" {}'
  for f in tests/fuzz/fuzz_*.c; do
    n=$(basename "$f" .c)
    clang $CF -o $OUT/$n "$f" $OUT/obj/*.o $LIBS -lm
    echo "built $OUT/$n"
  done
  ;;
run)
  n=$2; secs=$3; runs=${4:--1}
  mkdir -p $OUT/corpus-$n
  set +e
  # shellcheck disable=SC2086  # FUZZ_ARGS: words on purpose
  $OUT/$n -max_total_time="$secs" -runs="$runs" -print_final_stats=1 ${FUZZ_ARGS:-} \
    -artifact_prefix=$OUT/crash-$n- $OUT/corpus-$n "tests/fuzz/corpus/${n#fuzz_}" \
    > $OUT/$n.log 2>&1
  rc=$?
  set -e
  grep -E '^#[0-9]+' $OUT/$n.log | tail -1
  grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec' $OUT/$n.log || true
  echo "$n: exit $rc, corpus $(ls $OUT/corpus-$n | wc -l) files ($(du -sk $OUT/corpus-$n | cut -f1) KiB)"
  [ $rc -eq 0 ] || { tail -60 $OUT/$n.log; exit $rc; }
  ;;
*)
  sed -n 2,12p "$0"; exit 2 ;;
esac
