#!/usr/bin/env bash
# Stages into .device-kit/ (git-ignored) what bench/gpu_check.sh needs on the GPU machine and its
# image may lack: Fashion-MNIST, and the outside pieces of the build (cxxopts, GoogleTest's
# sources, Gloo's headers, zlib's and OpenSSL's libcrypto's headers and static libraries). Run here, on a machine with
# scripts/install-deps.sh's packages; carry .device-kit with the device call. Prints what it
# took from where and the size of tree + kit, which must stay under the tool's 64 MiB.
# Not here: libcurl (the device build leaves `dptrain download` out, see DPTRAIN_DOWNLOAD),
# protobuf and ISA-L (it leaves --tensorboard out, see DPTRAIN_TENSORBOARD) and
# LibTorch, CUDA and NCCL (the image's python3 torch provides them).
set -euo pipefail
cd "$(dirname "$0")/.."
kit=${1:-.device-kit}
data=${DPTRAIN_KIT_DATA:-/usr/share/datasets/fashion-mnist}
limit=$((64 * 1024 * 1024))

need() {  # need PATH WHAT: the source must exist here
  if [ ! -e "$1" ]; then
    echo "device-kit: $1 is missing ($2); run scripts/install-deps.sh" >&2
    exit 1
  fi
}
need "$data/train-images-idx3-ubyte.gz" "Fashion-MNIST, dataset-fashion-mnist"
need /usr/include/cxxopts.hpp "libcxxopts-dev"
need /usr/lib/cmake/cxxopts/cxxopts-config.cmake "libcxxopts-dev"
need /usr/src/googletest/googletest/CMakeLists.txt "googletest, the sources behind libgtest-dev"
need /usr/include/gloo/algorithm.h "libgloo-dev"
need /usr/include/zlib.h "zlib1g-dev"
need /usr/lib/x86_64-linux-gnu/libz.a "zlib1g-dev"
need /usr/include/openssl/evp.h "libssl-dev"
need /usr/include/x86_64-linux-gnu/openssl/configuration.h "libssl-dev"
need /usr/lib/x86_64-linux-gnu/libcrypto.a "libssl-dev"
need /usr/include/nlohmann/json.hpp "nlohmann-json3-dev"
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake "nlohmann-json3-dev"

rm -rf "$kit"
mkdir -p "$kit/data/fashion-mnist" "$kit/prefix/include" "$kit/prefix/lib/cmake" "$kit/src"
# The four data files as Debian ships them (dptrain reads them gzipped).
cp "$data"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$kit/data/fashion-mnist/"
# cxxopts: header-only; its CMake package finds the header three folders above itself.
cp /usr/include/cxxopts.hpp "$kit/prefix/include/"
cp -r /usr/lib/cmake/cxxopts "$kit/prefix/lib/cmake/"
# nlohmann-json: header-only (safetensors headers); its CMake package finds the headers three
# folders above itself, so it travels under prefix/share/cmake.
mkdir -p "$kit/prefix/share/cmake"
cp -r /usr/include/nlohmann "$kit/prefix/include/"
cp -r /usr/share/cmake/nlohmann_json "$kit/prefix/share/cmake/"
# GoogleTest: sources, built there with dptrain (FETCHCONTENT_SOURCE_DIR_GOOGLETEST). gmock is
# not needed; the top-level CMakeLists.txt builds googletest alone with BUILD_GMOCK off.
mkdir -p "$kit/src/googletest"
cp /usr/src/googletest/CMakeLists.txt "$kit/src/googletest/"
cp -r /usr/src/googletest/googletest "$kit/src/googletest/"
# Gloo: headers only (LibTorch carries the library); DPTRAIN_GLOO=AUTO checks that they compile
# against the image's ProcessGroupGloo.hpp and leaves Gloo out otherwise.
cp -r /usr/include/gloo "$kit/prefix/include/"
# zlib: headers and the static library, so that nothing depends on the image's libz.so name.
cp /usr/include/zlib.h /usr/include/zconf.h "$kit/prefix/include/"
cp /usr/lib/x86_64-linux-gnu/libz.a "$kit/prefix/lib/"
# OpenSSL's libcrypto (SHA-256 of downloads and of the training set in checkpoints): headers,
# the two that Debian keeps per architecture among them, and the static library; CMake's
# FindOpenSSL adds the threads and libdl that a static libcrypto needs.
cp -r /usr/include/openssl "$kit/prefix/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$kit/prefix/include/openssl/"
cp /usr/lib/x86_64-linux-gnu/libcrypto.a "$kit/prefix/lib/"

{
  echo "# dptrain device kit, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) by scripts/device-kit.sh"
  for package in dataset-fashion-mnist libcxxopts-dev googletest libgloo-dev zlib1g-dev libssl-dev nlohmann-json3-dev; do
    echo "# $package $(dpkg-query -W -f='${Version}' "$package" 2>/dev/null || echo '(version unknown)')"
  done
  (cd "$kit" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum)
} > "$kit/MANIFEST"

kit_bytes=$(du -sb "$kit" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((kit_bytes + tree_bytes))
awk -v kit="$kit" -v k="$kit_bytes" -v t="$tree_bytes" 'BEGIN {
  printf "device-kit: %s holds %.1f MiB; the working tree %.1f MiB; together %.1f MiB of 64 MiB\n",
    kit, k / 1048576, t / 1048576, (k + t) / 1048576 }'
du -sh "$kit"/data "$kit"/prefix "$kit"/src | sed 's/^/device-kit:   /'
if [ "$total" -ge "$limit" ]; then
  echo "device-kit: tree + kit exceed the 64 MiB a device call may carry" >&2
  exit 1
fi
