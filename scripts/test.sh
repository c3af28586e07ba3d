#!/usr/bin/env bash
# Installs dependencies, builds, runs every test suite (optimised build with assertions, then again
# under AddressSanitizer + UBSan, then the engine's suite under ThreadSanitizer; the sanitizer builds at
# -O1, which keeps their compile time down) and prints one closing line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

run_suite() {  # build dir, extra meson options... (TIMEOUT_MULTIPLIER: scales every suite's timeout)
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    mkdir -p logs
    meson setup "$dir" "$@" >"logs/$dir.setup.log" 2>&1 || { cat "logs/$dir.setup.log"; return 1; }
  fi
  meson compile -C "$dir" || return 1
  rm -rf "$dir/test-results"
  meson test -C "$dir" --print-errorlogs --num-processes 2 --timeout-multiplier "${TIMEOUT_MULTIPLIER:-1}" || true
}

status=0
run_suite build-test --buildtype=debugoptimized -Db_ndebug=false || status=1
# Under ASan the process-heavy suites (crash_consistency kills 190 writers) run several times slower.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TIMEOUT_MULTIPLIER=2 \
  run_suite build-asan --buildtype=debug -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false \
  -Dbenchmarks=false || status=1
# The engine's suite again under ThreadSanitizer (only that suite: the rest is single-threaded code).
if [ ! -f build-tsan/build.ninja ]; then
  mkdir -p logs
  meson setup build-tsan --buildtype=debug -Doptimization=1 -Db_sanitize=thread -Dtests=false -Dengine_tests_only=true \
    -Dbenchmarks=false >logs/build-tsan.setup.log 2>&1 || { cat logs/build-tsan.setup.log; status=1; }
fi
if meson compile -C build-tsan tests/engine/engine_parallel; then
  rm -rf build-tsan/test-results
  meson test -C build-tsan --no-rebuild --print-errorlogs engine_parallel || true
else
  status=1
fi
python3 scripts/summarize_tests.py build-test build-asan build-tsan || status=1
exit $status
