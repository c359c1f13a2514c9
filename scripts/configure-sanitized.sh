#!/usr/bin/env bash
# Configures the one sanitized build that scripts/sanitize.sh and scripts/fuzz.sh share, in the
# directory given: clang, AddressSanitizer and UBSan on dptrain's own targets, libFuzzer's
# coverage too (DPTRAIN_FUZZ), so that the library is compiled once for the quick tests and the
# fuzz targets both. Each script then builds only the targets it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="$1"
# Ninja for a new build folder, as scripts/build.sh.
generator=()
if [ ! -e "$build_dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
# -O1: quicker to build than -O2, still fast enough to run; -g1: line numbers in the stacks.
# Debug keeps assert() on; the test files themselves build at -O0 (tests/CMakeLists.txt).
# clang rather than g++: libFuzzer needs it, and it compiles these files about a quarter faster
# under ASan (bench/results/2026-12-04-ci-times.md).
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_CXX_COMPILER=clang++ -DDPTRAIN_SANITIZE=ON -DDPTRAIN_FUZZ=ON -DBUILD_TESTING=ON \
  -DDPTRAIN_WERROR=ON >/dev/null
