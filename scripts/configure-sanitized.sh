#!/usr/bin/env bash
# Configures the one sanitized build that scripts/sanitize.sh and scripts/fuzz.sh share, in the
# directory given: clang, AddressSanitizer and UBSan on dptrain's own targets, libFuzzer's
# coverage too (DPTRAIN_FUZZ), so that the library is compiled once for the quick tests and the
# fuzz targets both. Each script then builds only the targets it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="$1"
# -O1: quicker to build than -O2, still fast enough to run; -g1: line numbers in the stacks.
# Debug keeps assert() on; the test files themselves build at -O0 (tests/CMakeLists.txt).
# clang rather than g++: libFuzzer needs it, and it compiles these files a quarter faster under
# ASan (tests/train/test_checkpoint.cpp: 14.3 s of CPU against g++'s 18.7 s, AMD EPYC,
# 2026-12-03).
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_CXX_COMPILER=clang++ -DDPTRAIN_SANITIZE=ON -DDPTRAIN_FUZZ=ON -DBUILD_TESTING=ON \
  -DDPTRAIN_WERROR=ON >/dev/null
