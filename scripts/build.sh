#!/usr/bin/env bash
# Configures and builds dptrain (Release) into ./build, or into $DPTRAIN_BUILD_DIR.
# Extra arguments go to CMake, e.g. -DCMAKE_PREFIX_PATH=... for a CUDA LibTorch. Warnings are
# errors unless DPTRAIN_WERROR=OFF (the Docker image: another compiler may warn about more).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DPTRAIN_BUILD_DIR:-build}"
# Ninja for a new build folder (an existing one keeps the generator it was made with): it starts
# a layer's sources while the layer below still compiles, where Make waits for that layer's whole
# target, so both cores stay busy (bench/results/2026-12-04-ci-times.md).
generator=()
if [ ! -e "$build_dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DDPTRAIN_WERROR="${DPTRAIN_WERROR:-ON}" "$@"
cmake --build "$build_dir" -j "$(nproc)"
