#!/usr/bin/env bash
# Installs what dptrain needs on Debian 12 (run as root, or with sudo available):
# the compiler and CMake, Debian's CPU LibTorch 1.13 with Gloo headers, cxxopts, GoogleTest,
# zlib, libcurl, OpenSSL's libcrypto, nlohmann-json (safetensors headers), protobuf and ISA-L (--tensorboard's event files),
# tcmalloc-minimal (linked: the dptrain binary's malloc), the
# real Fashion-MNIST, Debian's python3-torch (torchrun for the multi-process tests), Chromium and
# libpng (the plot test renders the SVG headless and reads the screenshot), valgrind (the
# memory-layout test) and universal-ctags (the unity builds' name check).
# Arguments name more packages to install with them (scripts/fuzz.sh passes clang's).
set -euo pipefail

packages=(
  cmake g++ make ninja-build
  libtorch-dev libgloo-dev      # LibTorch 1.13 (CPU) and the Gloo headers c10d needs
  libcxxopts-dev libgtest-dev zlib1g-dev
  libtcmalloc-minimal4          # the dptrain binary's malloc, linked (core/cpu_allocator.h)
  libcurl4-openssl-dev          # dptrain download: http, https and file URLs
  libssl-dev                    # libcrypto's SHA-256, checking the downloaded files
  nlohmann-json3-dev            # safetensors headers and checkpoints' run state (JSON)
  libprotobuf-dev protobuf-compiler  # --tensorboard: events serialised from our .proto
  libisal-dev                   # --tensorboard: the event records' CRC-32C (crc32_iscsi)
  libpng-dev                    # the plot test decodes Chromium's PNG screenshots
  dataset-fashion-mnist         # /usr/share/datasets/fashion-mnist
  python3-torch                 # torchrun, for the multi-process tests
  python3-venv                  # quickstart.sh keeps the CUDA LibTorch of a GPU machine in a venv
  chromium                      # headless, renders the training plot's SVG in test_plot.cpp
  valgrind                      # checks the default layout for heap corruption (test_binary_runs.cpp)
  universal-ctags               # names each test file defines (tests/unity_names_check.py)
)
packages+=("$@")

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_if_needed apt-get update -qq
  sudo_if_needed apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all packages present"
