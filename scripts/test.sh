#!/usr/bin/env bash
# The second of the README's two commands: builds dptrain with its tests and runs them all with
# CTest. Needs what scripts/install-deps.sh installs (scripts/quickstart.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The pinned Python the tests read our files back with (TensorBoard's reader, safetensors).
bash scripts/test-venv.sh
bash scripts/build.sh -DBUILD_TESTING=ON
cd "${DPTRAIN_BUILD_DIR:-build}"
# CTest starts the tests it knows to be longest first, from the cost data it writes after each
# run; a fresh build has none and would start them last, in the order they are defined, with a
# core idle behind them. tests/ctest_costs.txt is that data for the tests over 3 s, from one
# `ctest -j2` run (bench/results/2026-12-04-ci-times.md): only the order depends on it, and CTest
# replaces it after the run.
mkdir -p Testing/Temporary
[ -e Testing/Temporary/CTestCostData.txt ] || cp "$root/tests/ctest_costs.txt" Testing/Temporary/CTestCostData.txt
# Every GoogleTest process writes its results under Testing/gtest (tests/CMakeLists.txt): this
# run's alone, so that tests/check_skips.py reads no stale skip.
rm -rf Testing/gtest
ctest --output-on-failure --timeout 900 --no-tests=error -j "${DPTRAIN_TEST_JOBS:-1}" \
  --output-junit "$PWD/Testing/ctest-junit.xml"
# CTest counts a skipped test as passed: each skip must be one tests/expected_skips.txt expects on
# this machine (no GPU, not root, no AVX-512, ...), or the run fails naming it.
python3 "$root/tests/check_skips.py" --expected "$root/tests/expected_skips.txt" \
  --results Testing/gtest --ctest-junit Testing/ctest-junit.xml
# A test compiled out or never registered leaves no result to count: the names of the tests that
# ran must be the list of this build's flavour (tests/expected_tests/), or the run fails naming
# each one missing or new.
python3 "$root/tests/check_executed.py" --build-dir . --results Testing/gtest \
  --ctest-junit Testing/ctest-junit.xml
