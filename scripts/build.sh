#!/usr/bin/env bash
# Configures and builds dptrain (Release) into ./build, or into $DPTRAIN_BUILD_DIR.
# Extra arguments go to CMake, e.g. -DCMAKE_PREFIX_PATH=... for a CUDA LibTorch. Warnings are
# errors unless DPTRAIN_WERROR=OFF (the Docker image: another compiler may warn about more).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DPTRAIN_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDPTRAIN_WERROR="${DPTRAIN_WERROR:-ON}" "$@"
cmake --build "$build_dir" -j "$(nproc)"
