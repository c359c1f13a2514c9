#!/usr/bin/env bash
# Builds dptrain's library, driver and quick tests with AddressSanitizer and UBSan into
# build-sanitize, or $DPTRAIN_SANITIZE_BUILD_DIR (scripts/configure-sanitized.sh, shared with
# scripts/fuzz.sh), and runs the quick tests under them (tests/sanitizers/quick_tests.txt): file
# formats, batching, random numbers, the command line, the rendezvous, the reducer. Not the
# training and multi-process tests: they spend minutes in LibTorch, which is not instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DPTRAIN_SANITIZE_BUILD_DIR:-build-sanitize}"
suppressions="$PWD/tests/sanitizers"
# clang, clang's sanitizer runtimes and libFuzzer, and llvm-symbolizer for readable stacks.
bash scripts/install-deps.sh clang libclang-rt-14-dev llvm

# LibTorch is not instrumented; what it trips is suppressed, each entry with its reason, in
# tests/sanitizers/. These also hold while the build runs the test binary to list its tests.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$suppressions/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="suppressions=$suppressions/ubsan.supp:print_stacktrace=1:halt_on_error=1"

bash scripts/configure-sanitized.sh "$build_dir"
cmake --build "$build_dir" -j "${DPTRAIN_SANITIZE_JOBS:-$(nproc)}" --target dptrain_quick_tests dptrain_app

# One pattern per line there, '-' for the excluded ones; GoogleTest wants them joined by ':'.
positive=() negative=()
while read -r pattern; do
  case "$pattern" in
    "" | "#"*) ;;
    -*) negative+=("${pattern#-}") ;;
    *) positive+=("$pattern") ;;
  esac
done < tests/sanitizers/quick_tests.txt
filter="$(IFS=:; echo "${positive[*]}")"
if [ "${#negative[@]}" -gt 0 ]; then filter+="-$(IFS=:; echo "${negative[*]}")"; fi
# One gtest shard per core, side by side (a test runs in one shard only: gtest deals them out by
# index); each shard's output is kept whole and shown after, in shard order.
shards=${DPTRAIN_SANITIZE_TEST_SHARDS:-$(nproc)}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((shard = 0; shard < shards; shard++)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
    "$build_dir/tests/dptrain_quick_tests" --gtest_filter="$filter" --gtest_brief=1 \
    >"$logs/$shard" 2>&1 &
  pids+=($!)
done
failed=0
for ((shard = 0; shard < shards; shard++)); do
  status=0
  wait "${pids[$shard]}" || status=$?
  echo "sanitize: shard $((shard + 1)) of $shards (exit $status):"
  cat "$logs/$shard"
  [ "$status" -eq 0 ] || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "sanitize: a shard of the quick tests failed under AddressSanitizer or UBSan (above)" >&2
  exit 1
fi
echo "sanitize: the quick tests pass under AddressSanitizer and UBSan"
