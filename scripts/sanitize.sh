#!/usr/bin/env bash
# Builds dptrain's library, driver and tests with AddressSanitizer and UBSan into build-sanitize,
# or $DPTRAIN_SANITIZE_BUILD_DIR (scripts/configure-sanitized.sh, shared with scripts/fuzz.sh),
# and runs the quick tests under them (CTest label `quick`): file formats, batching, random
# numbers, the command line, the rendezvous, the reducer, checkpoints, one binary run of each
# kind. Not the training and multi-process tests (label `slow`): they spend minutes in LibTorch,
# which is not instrumented.
# --build-only: the build alone (.ci/run builds it beside the other tests, at the lowest priority).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=false
[ "${1:-}" = --build-only ] && build_only=true
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
cmake --build "$build_dir" -j "${DPTRAIN_SANITIZE_JOBS:-$(nproc)}" --target dptrain_test_binaries
if $build_only; then exit 0; fi

# The quick tests (tests/CMakeLists.txt, Note [One test binary per layer]): every layer's tests
# but those its binary names as slow, as GoogleTest shards, two at a time on two cores. Their
# skips are checked as in scripts/test.sh.
cd "$build_dir"
rm -rf Testing/gtest
ctest -L quick --output-on-failure --timeout 900 --no-tests=error \
  -j "${DPTRAIN_SANITIZE_TEST_JOBS:-$(nproc)}" --output-junit "$PWD/Testing/ctest-junit.xml"
DPTRAIN_SANITIZED_RUN=1 python3 ../tests/check_skips.py --expected ../tests/expected_skips.txt \
  --results Testing/gtest --ctest-junit Testing/ctest-junit.xml
python3 ../tests/check_executed.py --build-dir . --results Testing/gtest \
  --ctest-junit Testing/ctest-junit.xml
echo "sanitize: the quick tests pass under AddressSanitizer and UBSan"
