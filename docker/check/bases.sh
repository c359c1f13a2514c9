# shellcheck shell=bash
# Sourced by docker/check.sh: makes the base images that no registry can give this machine.
#   localhost/dptrain-check/debian:bookworm   Debian 12 minbase from debootstrap (cached tarball)
#   localhost/dptrain-check/cuda:devel, :base
#                                             stand-ins for NVIDIA's CUDA 13 images: Debian 12 plus
#                                             this machine's CUDA toolkit (devel: nvcc, headers,
#                                             the linked libraries; base: libcudart)
# Not here: the images of dptrain itself (build-images.sh).

readonly kDebianBase=localhost/dptrain-check/debian:bookworm

# In this sandbox debootstrap leaves the tree's /proc mounted: the host's /proc must not end up
# in the image, nor stop rm. Lazily: a process may still hold it for a moment. Deepest first.
bases_unmount_below() {
  [ -d "$1" ] || return 0
  findmnt -rn -o TARGET | { grep "^$(readlink -f "$1")/" || true; } | sort -r |
    xargs -r -n 1 umount --lazy
}

# The debootstrap tree is the slow part (about 1.5 min), so its tarball is kept in the work
# folder and only imported again when the image is gone.
bases_make_debian() {
  local work_dir=$1
  local tarball=$work_dir/debian-bookworm-minbase.tar
  if podman image exists "$kDebianBase"; then return; fi
  if [ ! -s "$tarball" ]; then
    local rootfs=$work_dir/debian-rootfs
    bases_unmount_below "$rootfs"
    rm -rf "$rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    bases_unmount_below "$rootfs"
    # apt inside the builds reads these, the suites of the debian:bookworm-slim image users pull.
    printf '%s\n' 'deb http://deb.debian.org/debian bookworm main' \
      'deb http://deb.debian.org/debian bookworm-updates main' \
      'deb http://deb.debian.org/debian-security bookworm-security main' \
      > "$rootfs/etc/apt/sources.list"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" --one-file-system -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import --change 'CMD ["/bin/bash"]' "$tarball" "$kDebianBase" >/dev/null
}

# The stand-ins are built from a trimmed copy of the toolkit. It was put together from PyPI's
# nvidia-* wheels, with cuDNN and NCCL merged in; dptrain takes those two from the torch wheel,
# so only the compiler, the headers and the libraries that LibTorch's CMake config links
# (third_party/cuda_toolkit.cmake) go in, plus the driver stub that config asks for and the
# static runtime that CMake's CUDA compiler check links (cudadevrt, cudart_static, culibos).
readonly kCudaLinkedLibraries="cudart cublas cublasLt cufft curand cusparse cusolver nvrtc
  nvrtc-builtins nvJitLink nvvm nvtx3interop"
readonly kCudaStaticLibraries="cudadevrt cudart_static culibos"
bases_make_cuda() {
  local work_dir=$1 devel_tag=$2 base_tag=$3
  local cuda
  cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
  local context=$work_dir/cuda-context
  if podman image exists "$devel_tag" && podman image exists "$base_tag"; then return; fi
  rm -rf "$context" && mkdir -p "$context/cuda/lib64"
  cp -a "$cuda/bin" "$cuda/include" "$cuda/nvvm" "$context/cuda/"
  cp -a "$cuda/lib/cmake" "$cuda/lib/stubs" "$context/cuda/lib64/"
  local name
  for name in $kCudaLinkedLibraries; do
    cp -a "$cuda/lib/lib$name".so* "$context/cuda/lib64/"
  done
  for name in $kCudaStaticLibraries; do
    cp -a "$cuda/lib/lib$name.a" "$context/cuda/lib64/"
  done
  podman build --network host -f docker/check/cuda-standin.Containerfile \
    --build-arg "BASE=$kDebianBase" --target devel -t "$devel_tag" "$context" >/dev/null
  podman build --network host -f docker/check/cuda-standin.Containerfile \
    --build-arg "BASE=$kDebianBase" --target base -t "$base_tag" "$context" >/dev/null
  rm -rf "$context"
}
