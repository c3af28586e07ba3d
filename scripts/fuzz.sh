#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/) with clang 16, libFuzzer, ASan and UBSan in build-fuzz, and runs each for
# the given seconds (default 60) with -rss_limit_mb=1024 -timeout=10, over a working copy of its committed
# corpus. Prints executions and finds per target; crashes, leaks, timeouts and out-of-memory inputs land in
# build-fuzz/findings/<target>/. See docs/fuzzing.md.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --seed-corpus   regenerate fuzz/corpus/<target>/ from the library's seeds (keeps fuzzed-*)
#   scripts/fuzz.sh --merge         the same, with up to 15 inputs from the working corpora (build-fuzz/work/)
set -uo pipefail
cd "$(dirname "$0")/.."
CXX_FUZZ=${CXX_FUZZ:-clang++-16}
BUILD=build-fuzz
TARGETS_ALL=(snapshot_restore snapshot_set_rescale spec_build reader_records reader_lines reader_line_blocks
             reader_token_windows)

if [ ! -f "$BUILD/build.ninja" ]; then
  mkdir -p logs
  CXX=$CXX_FUZZ meson setup "$BUILD" --buildtype=debug -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false \
    -Dcpp_args=-fsanitize=fuzzer-no-link -Dfuzzing=true -Dtests=false -Dbenchmarks=false >logs/$BUILD.setup.log 2>&1 \
    || { cat logs/$BUILD.setup.log; exit 1; }
fi
ninja -C "$BUILD" -j "${FUZZ_JOBS:-1}" $(printf 'fuzz/fuzz_%s ' "${TARGETS_ALL[@]}") fuzz/fuzz_make_corpus >/dev/null || exit 1

# The runtime options that make a report useful and a UBSan report fatal.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
COMMON=(-rss_limit_mb=1024 -timeout=10 -max_len=65536 -print_final_stats=1)

if [ "${1:-}" = "--seed-corpus" ] || [ "${1:-}" = "--merge" ]; then
  # The committed corpus: the seeds that add coverage (-set_cover_merge=1), plus up to 15 inputs of the
  # working corpus's own minimal cover, so the replay reaches past the seeds while staying a few dozen files.
  seeds=$BUILD/seeds
  rm -rf "$seeds"
  "$BUILD/fuzz/fuzz_make_corpus" "$seeds" "$PWD"
  for t in "${TARGETS_ALL[@]}"; do
    mkdir -p "$BUILD/work/$t"
    cover=$BUILD/merged/$t new=$BUILD/corpus-new/$t
    rm -rf "$cover" "$new"; mkdir -p "$cover" "$new"
    "$BUILD/fuzz/fuzz_$t" -set_cover_merge=1 "${COMMON[@]}" "$new" "$seeds/$t" >"$BUILD/merge-$t.log" 2>&1 \
      || { tail -30 "$BUILD/merge-$t.log"; exit 1; }
    if [ "$1" = "--merge" ]; then
      "$BUILD/fuzz/fuzz_$t" -set_cover_merge=1 "${COMMON[@]}" "$cover" "$BUILD/work/$t" >>"$BUILD/merge-$t.log" 2>&1 \
        || { tail -30 "$BUILD/merge-$t.log"; exit 1; }
      for f in $(ls "$cover" | head -15); do cp "$cover/$f" "$new/fuzzed-$f"; done
    else
      cp fuzz/corpus/$t/fuzzed-* "$new/" 2>/dev/null || true
    fi
    rm -rf "fuzz/corpus/$t"; mkdir -p fuzz/corpus; mv "$new" "fuzz/corpus/$t"
    echo "$t: $(ls "fuzz/corpus/$t" | wc -l) corpus files"
  done
  exit 0
fi

SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${TARGETS_ALL[@]}")
status=0
for t in "${TARGETS[@]}"; do
  work=$BUILD/work/$t findings=$BUILD/findings/$t
  mkdir -p "$work" "$findings"
  log=$BUILD/fuzz-$t.log
  # -fork=1 with -ignore_*: libFuzzer goes on after a crash, timeout or OOM, so one find does not end the run.
  "$BUILD/fuzz/fuzz_$t" "${COMMON[@]}" -max_total_time="$SECONDS_EACH" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
    -ignore_ooms=1 -artifact_prefix="$findings/" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  finds=$(ls "$findings" | grep -c -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  echo "$t: ${execs:-0} executions in ${SECONDS_EACH} s, $finds finds (artifacts in $findings/, log $log)"
  [ "$finds" -gt 0 ] && status=1
  [ $rc -ne 0 ] && [ "$finds" = 0 ] && { echo "$t: libFuzzer exited $rc"; tail -20 "$log"; status=1; }
done
exit $status
