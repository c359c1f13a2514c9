# shellcheck shell=bash
# Sourced by docker/check.sh: builds dptrain's images with podman, cold (--no-cache) unless the
# caller asks to reuse layers, and records each build's result, size and time for the table.
#   dptrain-cpu:latest       docker/Dockerfile.cpu on the Debian base
#   dptrain:latest           docker/Dockerfile, target runtime, on the CUDA stand-ins
#   dptrain-torchrun:latest  docker/Dockerfile, target torchrun (the builder plus torchrun)
# Not here: running them (run-images.sh).

# The host's CA bundle is mounted for the build only and named to pip by PIP_CERT, so pip
# trusts this machine's TLS proxy without the bundle entering any layer.
readonly kBuildCaBundle=/run/dptrain-build/ca.crt

# build_image LOG NAME ARGS...: one podman build into LOG; appends "NAME|yes/no|seconds" to
# $build_results. Builds use the host's network: podman's own bridge would edit the firewall.
# Docker's image format, as `docker build` makes: the OCI format has no SHELL, and podman would
# run every RUN line with /bin/sh instead of bash -o pipefail.
build_image() {
  local log=$1 name=$2
  shift 2
  local started=$SECONDS status=yes
  podman build --format docker --network host "$@" . >"$log" 2>&1 || status=no
  echo "$name|$status|$((SECONDS - started))" >>"$build_results"
  [ "$status" = yes ]
}

# CACHE is --no-cache or empty.
build_cpu_image() {
  local work_dir=$1 cache=()
  [ -z "$2" ] || cache=("$2")
  build_image "$work_dir/build-cpu.log" dptrain-cpu:latest "${cache[@]}" \
    -f docker/Dockerfile.cpu --build-arg "BASE=$kDebianBase" -t dptrain-cpu:latest
}

# The runtime target first (the builder's layers stay in the store), then the torchrun target,
# which reuses them: it adds a user and an entrypoint, so it is never cold on its own.
build_cuda_images() {
  local work_dir=$1 devel_tag=$3 base_tag=$4 cache=()
  [ -z "$2" ] || cache=("$2")
  local ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
  local common=(-f docker/Dockerfile --build-arg "BUILDER_BASE=$devel_tag"
                --build-arg "RUNTIME_BASE=$base_tag" -v "$ca:$kBuildCaBundle:ro"
                --build-arg "PIP_CERT=$kBuildCaBundle")
  build_image "$work_dir/build-cuda.log" dptrain:latest "${cache[@]}" "${common[@]}" \
    --target runtime -t dptrain:latest || return 1
  build_image "$work_dir/build-torchrun.log" dptrain-torchrun:latest "${common[@]}" \
    --target torchrun -t dptrain-torchrun:latest
}

# "1.23 GB", as podman counts an image (all its layers, shared ones included).
image_size() {
  podman image inspect --format '{{.Size}}' "$1" 2>/dev/null |
    awk '{ printf "%.2f GB", $1 / 1e9 }'
}
