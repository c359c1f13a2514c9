#!/usr/bin/env bash
# Rehearses the GPU machine's call here, in a root shaped like that machine: builds the device kit
# (scripts/device-kit.sh), copies the working tree as the device tool sends it (tracked and
# untracked-not-ignored files, plus the kit) into a minimal Debian root that has only g++, CMake,
# ninja and ccache -- none of the -dev packages this machine has, so a kit piece that is missing
# fails here -- and runs bench/gpu_check.sh there. Like the GPU machine's image, the root sees
# PyPI's torch==2.11.0 with its nvidia-* wheels (NCCL, cuDNN, cuBLAS, ... in site-packages; the
# venv named below, read-only, with its Python) and a CUDA toolkit with nvcc but WITHOUT NCCL or
# cuDNN: this machine's toolkit has both merged in, which no user's has, so the rehearsal uses a
# copy with them taken out (hard links, made once). Without a GPU its CUDA steps report
# "skipped: no GPU" and run their CPU equivalents. Needs root (chroot, mounts); not for CI.
#
#   bash scripts/rehearse-device.sh            # results in /var/tmp/dptrain-rehearsal-out
#
# Environment: DPTRAIN_REHEARSAL_ROOT (the minimal root; made with debootstrap when missing),
# DPTRAIN_REHEARSAL_VENV (a venv with torch 2.11, default /work/main/.venv-torch),
# DPTRAIN_REHEARSAL_CUDA (the toolkit the root sees as /usr/local/cuda; default: this machine's
# without NCCL and cuDNN, in /var/tmp/dptrain-rehearsal-cuda; any toolkit root works, one made of
# PyPI's nvidia-* wheels too), DPTRAIN_REHEARSAL_OUT, DPTRAIN_REHEARSAL_MIRROR (debootstrap's
# mirror; default: the first of this machine's apt sources), and DPTRAIN_CHECK_BUDGET /
# DPTRAIN_CHECK_SCALE for gpu_check.sh (two shared cores need far more than the GPU machine's 16).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${DPTRAIN_REHEARSAL_ROOT:-/var/tmp/dptrain-rehearsal-root}
venv=${DPTRAIN_REHEARSAL_VENV:-/work/main/.venv-torch}
out=${DPTRAIN_REHEARSAL_OUT:-/var/tmp/dptrain-rehearsal-out}
cuda_bare=/var/tmp/dptrain-rehearsal-cuda
cuda=${DPTRAIN_REHEARSAL_CUDA:-$cuda_bare}

fail() { echo "rehearse-device: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (chroot and mounts)"
[ -x "$venv/bin/python3" ] || fail "no venv with torch at $venv"
site=$("$venv/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
for wheel in nccl/include/nccl.h nccl/lib/libnccl.so.2 cudnn/lib/libcudnn.so.9; do
  [ -e "$site/nvidia/$wheel" ] || fail "$site/nvidia/$wheel is missing: the venv lacks torch's nvidia-* wheels"
done

# ---- The toolkit: nvcc and CUDA's own libraries, no NCCL, no cuDNN ---------------------------
if [ "$cuda" = "$cuda_bare" ] && [ ! -x "$cuda_bare/bin/nvcc" ]; then
  system_cuda=$(realpath /usr/local/cuda)
  rm -rf "$cuda_bare.tmp"
  cp -al "$system_cuda" "$cuda_bare.tmp" 2>/dev/null || cp -a "$system_cuda" "$cuda_bare.tmp"
  find "$cuda_bare.tmp" \( -iname '*nccl*' -o -iname '*cudnn*' \) -prune -exec rm -rf {} +
  mv "$cuda_bare.tmp" "$cuda_bare"
fi
[ -x "$cuda/bin/nvcc" ] || fail "$cuda/bin/nvcc is missing (DPTRAIN_REHEARSAL_CUDA)"
leftover=$(find -L "$cuda" \( -iname 'nccl*.h' -o -iname 'libnccl*' -o -iname 'cudnn*.h' -o -iname 'libcudnn*' \) -print -quit)
[ -z "$leftover" ] || fail "$leftover: the rehearsal's toolkit must have no NCCL or cuDNN"

# ---- The minimal root: a compiler and build tools, no libraries' headers --------------------
if [ ! -x "$root/usr/bin/g++" ]; then
  # This machine's own Debian mirror (deb822 or one-line sources), unless one is named.
  # (A missing sources.list is no error: under pipefail cat's status would end the script.)
  mirror=${DPTRAIN_REHEARSAL_MIRROR:-$({ cat /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null || true; } | awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}')}
  [ -n "$mirror" ] || fail "no Debian mirror in this machine's apt sources: set DPTRAIN_REHEARSAL_MIRROR"
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  debootstrap --variant=minbase --include=g++,cmake,ninja-build,make,ccache,ca-certificates,procps \
    bookworm "$root" "$mirror"
fi
hidden=(usr/include/cxxopts.hpp usr/include/gtest usr/include/gloo usr/include/curl
  usr/include/zlib.h usr/lib/x86_64-linux-gnu/libz.so usr/lib/x86_64-linux-gnu/libz.a
  usr/lib/x86_64-linux-gnu/libcurl.so usr/src/googletest usr/lib/cmake/cxxopts
  usr/include/nlohmann usr/share/cmake/nlohmann_json
  usr/share/datasets/fashion-mnist usr/lib/x86_64-linux-gnu/cmake/Torch usr/include/openssl
  usr/lib/x86_64-linux-gnu/libcrypto.so usr/lib/x86_64-linux-gnu/libcrypto.a
  usr/include/nccl.h usr/local/include/nccl.h usr/include/cudnn.h usr/local/include/cudnn.h)
[ ! -L "$root/usr/local/cuda" ] || rm "$root/usr/local/cuda"  # an older rehearsal's link
for path in "${hidden[@]}"; do
  [ ! -e "$root/$path" ] || fail "$root/$path exists: the root is not clean; remove it"
done

# ---- What travels: the tree as the device tool sends it, and the kit --------------------------
bash scripts/device-kit.sh
rm -rf "$root/src" "$out"
mkdir -p "$root/src" "$out"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r cp -a --parents -t "$root/src"
cp -a .device-kit "$root/src/"

# ---- The run: a private mount namespace, torch and CUDA read-only, the cache shared -----------
python_home=$("$venv/bin/python3" -c 'import sys; print(sys.base_prefix)')
cuda=$(realpath "$cuda")
ccache_dir=${CCACHE_DIR:-/work/.ccache}
mkdir -p "$ccache_dir"
export root venv python_home cuda ccache_dir out
# shellcheck disable=SC2016  # expanded by the inner bash, from the exported variables
unshare --mount --propagation private bash -euo pipefail -c '
  bind() {  # bind SOURCE [ro]: the same path inside the root
    mkdir -p "$root/$1"
    mount --bind "$1" "$root/$1"
    if [ "${2:-}" = ro ]; then mount -o remount,bind,ro "$root/$1"; fi
  }
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs tmpfs "$root/tmp"
  bind "$venv" ro
  bind "$python_home" ro
  mkdir -p "$root/usr/local/cuda"
  mount --bind "$cuda" "$root/usr/local/cuda"
  mount -o remount,bind,ro "$root/usr/local/cuda"
  mkdir -p "$root/ccache" "$root/out"
  mount --bind "$ccache_dir" "$root/ccache"
  mount --bind "$out" "$root/out"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH="$venv/bin:/usr/local/cuda/bin:/usr/bin:/bin" OUT=/out \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_DIR=/ccache CCACHE_BASEDIR=/src \
    DPTRAIN_CHECK_BUDGET="${DPTRAIN_CHECK_BUDGET:-5400}" DPTRAIN_CHECK_SCALE="${DPTRAIN_CHECK_SCALE:-15}" \
    DPTRAIN_CHECK_JOBS="${DPTRAIN_CHECK_JOBS:-2}" bash /src/bench/gpu_check.sh
' && status=0 || status=$?
echo "rehearse-device: gpu_check.sh exited with $status; its files are in $out:"
ls -l "$out"
exit "$status"
