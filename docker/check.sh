#!/usr/bin/env bash
# Checks dptrain's container images.
#   bash docker/check.sh --lint   seconds, no podman: the Dockerfile still fits the repository
#                                 (docker/check/lint.sh); what CI runs
#   bash docker/check.sh          the real check (15-40 min cold on 2 cores): installs podman,
#                                 makes the base images, builds both images cold, runs them and
#                                 the compose services, prints a table, leaves nothing running
#   bash docker/check.sh --reuse-images   the same, building only images that are missing
# Everything goes through podman with CONTAINERS_CONF=build-docker/containers.conf; builds use
# --network host and runs --network none (one download run uses the host's loopback), so the
# host's firewall and IP forwarding stay as they were (printed before and after).
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in
  --lint) exec bash docker/check/lint.sh ;;
  ''|--reuse-images) ;;
  *) echo "usage: bash docker/check.sh [--lint | --reuse-images]" >&2; exit 2 ;;
esac
mode=${1:-cold}
[ "$(id -u)" -eq 0 ] || { echo "error: docker/check.sh needs root (podman, debootstrap)" >&2; exit 2; }

work_dir=$PWD/build-docker
readonly kCudaDevelStandIn=localhost/dptrain-check/cuda:13-devel-debian12
readonly kCudaBaseStandIn=localhost/dptrain-check/cuda:13-base-debian12
# shellcheck source=docker/check/podman-env.sh
source docker/check/podman-env.sh
# shellcheck source=docker/check/bases.sh
source docker/check/bases.sh
# shellcheck source=docker/check/build-images.sh
source docker/check/build-images.sh

check_started=$SECONDS
podman_env_setup "$work_dir"
network_before=$(host_network_state)
echo "check: host network before: $network_before"
bash docker/check/lint.sh >"$work_dir/lint.log" 2>&1 && lint_result=pass || lint_result=fail
echo "check: lint: $lint_result ($(tail -n 1 "$work_dir/lint.log"))"

# ---- Bases (cached) ------------------------------------------------------------------------------
started=$SECONDS
bases_make_debian "$work_dir"
bases_make_cuda "$work_dir" "$kCudaDevelStandIn" "$kCudaBaseStandIn"
echo "check: base images ready ($((SECONDS - started)) s)"

# ---- Builds: the CPU image and the CUDA images side by side -------------------------------------
# Side by side because the CUDA build spends minutes fetching the torch wheel (2.7 GB) while the
# CPU build compiles; each build's time below is its own wall time, with the other running.
build_results=$work_dir/build-results.txt
if [ "$mode" = cold ]; then
  : >"$build_results"
  cache_flag=--no-cache
else
  touch "$build_results"
  cache_flag=""
fi
needs_build() { [ "$mode" = cold ] || ! podman image exists "$1"; }
started=$SECONDS
if needs_build dptrain-cpu:latest; then
  sed -i '/^dptrain-cpu:latest|/d' "$build_results"
  build_cpu_image "$work_dir" "$cache_flag" &
  cpu_build=$!
fi
if needs_build dptrain:latest || needs_build dptrain-torchrun:latest; then
  sed -i '/^dptrain:latest|/d; /^dptrain-torchrun:latest|/d' "$build_results"
  build_cuda_images "$work_dir" "$cache_flag" "$kCudaDevelStandIn" "$kCudaBaseStandIn" &
  cuda_build=$!
fi
if [ -n "${cpu_build:-}" ] && ! wait "$cpu_build"; then
  echo "check: the CPU image did not build: $work_dir/build-cpu.log"
fi
if [ -n "${cuda_build:-}" ] && ! wait "$cuda_build"; then
  echo "check: a CUDA image did not build: $work_dir/build-cuda.log, build-torchrun.log"
fi
echo "check: builds done ($((SECONDS - started)) s)"

# ---- Runs ------------------------------------------------------------------------------------------
# shellcheck source=docker/check/run-images.sh
source docker/check/run-images.sh
run_results=$work_dir/run-results.txt
: >"$run_results"
for image in dptrain-cpu:latest dptrain:latest; do
  if podman image exists "$image"; then run_image_checks "$work_dir" "$image"; fi
done
# shellcheck source=docker/check/compose-services.sh
source docker/check/compose-services.sh
compose_run_services "$work_dir"
run_cleanup

# ---- Table -----------------------------------------------------------------------------------------
podman image prune -f >/dev/null
network_after=$(host_network_state)
# shellcheck source=docker/check/report.sh
source docker/check/report.sh
report_table "$build_results" "$run_results"
echo
echo "lint: $lint_result"
echo "host network before: $network_before"
echo "host network after:  $network_after"
[ "$network_before" = "$network_after" ] || echo "FAIL: the host's network settings changed"
echo "check: total $((SECONDS - check_started)) s, $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
echo
podman images
echo
podman ps -a
report_all_passed "$build_results" "$run_results" && [ "$network_before" = "$network_after" ]
