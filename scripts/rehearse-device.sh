#!/usr/bin/env bash
# Rehearses the GPU machine's call here: builds the device kit (scripts/device-kit.sh), copies the
# working tree as the device tool sends it (tracked and untracked-not-ignored files, plus the
# kit) into a minimal Debian root that has only g++, CMake, ninja and ccache -- none of the
# -dev packages this machine has, so a kit piece that is missing fails here -- and runs
# bench/gpu_check.sh there against PyPI's torch==2.11.0 (the venv named below, mounted
# read-only with its Python and the CUDA toolkit). Without a GPU its CUDA steps report
# "skipped: no GPU" and run their CPU equivalents. Needs root (chroot, mounts); not for CI.
#
#   bash scripts/rehearse-device.sh            # results in /var/tmp/dptrain-rehearsal-out
#
# Environment: DPTRAIN_REHEARSAL_ROOT (the minimal root; made with debootstrap when missing),
# DPTRAIN_REHEARSAL_VENV (a venv with torch 2.11, default /work/main/.venv-torch),
# DPTRAIN_REHEARSAL_OUT, and DPTRAIN_CHECK_BUDGET / DPTRAIN_CHECK_SCALE for gpu_check.sh (two
# shared cores need far more than the GPU machine's sixteen).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${DPTRAIN_REHEARSAL_ROOT:-/var/tmp/dptrain-rehearsal-root}
venv=${DPTRAIN_REHEARSAL_VENV:-/work/main/.venv-torch}
out=${DPTRAIN_REHEARSAL_OUT:-/var/tmp/dptrain-rehearsal-out}
mirror=${DPTRAIN_REHEARSAL_MIRROR:-http://deb.debian.org/debian}

[ "$(id -u)" -eq 0 ] || { echo "rehearse-device: needs root (chroot and mounts)" >&2; exit 1; }
[ -x "$venv/bin/python3" ] || { echo "rehearse-device: no venv with torch at $venv" >&2; exit 1; }

# ---- The minimal root: a compiler and build tools, no libraries' headers --------------------
if [ ! -x "$root/usr/bin/g++" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  debootstrap --variant=minbase --include=g++,cmake,ninja-build,make,ccache,ca-certificates,procps \
    bookworm "$root" "$mirror"
fi
hidden=(usr/include/cxxopts.hpp usr/include/gtest usr/include/gloo usr/include/curl
  usr/include/zlib.h usr/lib/x86_64-linux-gnu/libz.so usr/lib/x86_64-linux-gnu/libz.a
  usr/lib/x86_64-linux-gnu/libcurl.so usr/src/googletest usr/lib/cmake/cxxopts
  usr/share/datasets/fashion-mnist usr/lib/x86_64-linux-gnu/cmake/Torch usr/include/openssl
  usr/lib/x86_64-linux-gnu/libcrypto.so usr/lib/x86_64-linux-gnu/libcrypto.a)
for path in "${hidden[@]}"; do
  if [ -e "$root/$path" ]; then
    echo "rehearse-device: $root/$path exists: the root is not clean; remove it" >&2
    exit 1
  fi
done

# ---- What travels: the tree as the device tool sends it, and the kit --------------------------
bash scripts/device-kit.sh
rm -rf "$root/src" "$out"
mkdir -p "$root/src" "$out"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r cp -a --parents -t "$root/src"
cp -a .device-kit "$root/src/"

# ---- The run: a private mount namespace, torch and CUDA read-only, the cache shared -----------
python_home=$("$venv/bin/python3" -c 'import sys; print(sys.base_prefix)')
cuda=$(realpath /usr/local/cuda)
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
  bind "$cuda" ro
  ln -sfn "$cuda" "$root/usr/local/cuda"
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
