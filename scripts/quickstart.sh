#!/usr/bin/env bash
# The first of the README's two commands: installs what dptrain needs, builds it and runs the
# main experiment on the devices present.
#   - With an NVIDIA GPU: PyPI's CUDA LibTorch (torch==$DPTRAIN_TORCH_VERSION, pinned in
#     scripts/torch-version.sh, in ./.venv-torch) is installed
#     and the book's reference run follows: one GPU, batch 256, lr 0.1, 10 epochs.
#   - Without: Debian's CPU LibTorch, and the same run on a narrow model (--width 8): about 10
#     minutes on two idle cores. Its result, and the CPUs and seeds it was measured on, are in the
#     README; fewer epochs would not do: this recipe's test accuracy swings from epoch to epoch
#     early on. The full-width model needs ~11 s per batch on such a CPU.
# Arguments are passed on to `dptrain train`, after the defaults chosen here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  if [ ! -x .venv-torch/bin/python ]; then
    python3 -m venv .venv-torch
    # shellcheck source=scripts/torch-version.sh
    . scripts/torch-version.sh
    .venv-torch/bin/pip install -q "torch==$DPTRAIN_TORCH_VERSION"
  fi
  torch_root=$(.venv-torch/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  DPTRAIN_BUILD_DIR=build-cuda bash scripts/build.sh \
    -DCMAKE_PREFIX_PATH="$torch_root/share/cmake;$torch_root" -DBUILD_TESTING=OFF
  exec ./build-cuda/app/dptrain train --gpus 1 --batch-size 256 --lr 0.1 --epochs 10 "$@"
fi

bash scripts/build.sh -DBUILD_TESTING=OFF
# The thread count and the layout the README's figures were measured with: two threads where there
# are two cores, and contiguous (AVX-512 CPUs default to channels-last; the README's float32
# runs are contiguous: bench/results/2026-12-01-cpu-book-runs.md).
threads=$(( $(nproc) >= 2 ? 2 : 1 ))
exec ./build/app/dptrain train --devices cpu --width 8 --batch-size 256 --lr 0.1 --epochs 10 \
  --threads "$threads" --memory-format contiguous "$@"
