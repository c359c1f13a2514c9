# shellcheck shell=bash
# The PyPI torch release whose LibTorch dptrain's CUDA path installs: the one place it is pinned.
# Sourced by scripts/quickstart.sh and docker/Dockerfile; DPTRAIN_TORCH_VERSION in the environment
# (the Dockerfile: --build-arg TORCH_VERSION) overrides it. The releases built and tested, and
# when: docs/cuda-build.md, "LibTorch versions built".
DPTRAIN_TORCH_VERSION=${DPTRAIN_TORCH_VERSION:-2.11.0}
