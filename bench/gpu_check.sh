#!/usr/bin/env bash
# The one command for the GPU machine: builds dptrain against the image's PyTorch with only the
# device kit (scripts/device-kit.sh, carried as .device-kit), then runs the CUDA tests, the
# book's one-GPU run in fp32 and bf16, the PyTorch peer as the book writes it and tuned, the
# NCCL fault checks and a world of one on NCCL, each step under its own timeout and all of them
# within DPTRAIN_CHECK_BUDGET seconds (470 by default: the 8 minutes of the plan, with a margin
# inside the tool's 10). Writes summary.md, the four runs' per-epoch records and logs.tar.gz to
# $OUT (7 files; the tool returns 8) and prints the summary last.
# Without a GPU (scripts/rehearse-device.sh) each CUDA step says "skipped: no GPU" and runs its
# CPU equivalent instead, so that everything but the GPU itself is exercised.
#
#   device tool: run(command="bash bench/gpu_check.sh", carry=[".device-kit"], timeout_s=560)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-check-out}
KIT=$(realpath -m "${DPTRAIN_KIT:-.device-kit}")
BUDGET=${DPTRAIN_CHECK_BUDGET:-470}
SCALE=${DPTRAIN_CHECK_SCALE:-1}  # multiplies each step's cap (a 2-core rehearsal needs more)
JOBS=${DPTRAIN_CHECK_JOBS:-$(nproc)}
BUILD=${DPTRAIN_CHECK_BUILD_DIR:-build-gpu-check}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
SUMMARY=$LOGS/summary.md
BEGIN=$SECONDS
DATA=$KIT/data/fashion-mnist
export DPTRAIN_DATA=$DATA PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME CAP COMMAND: runs COMMAND (a bash snippet) under min(CAP * SCALE, time left),
# logging to $LOGS/NAME.log, and adds one row to the summary. Returns the command's status.
ROWS=()
step() {
  local name=$1 cap=$2 command=$3
  local left=$((BUDGET - (SECONDS - BEGIN)))
  local limit=$((cap * SCALE < left ? cap * SCALE : left))
  if [ "$limit" -lt 15 ]; then
    ROWS+=("| $name | skipped: out of time | 0 |")
    return 99
  fi
  echo "== $name (up to ${limit}s)" >&2
  local start=$SECONDS status
  timeout --kill-after=10 "$limit" bash -o pipefail -c "$command" >"$LOGS/$name.log" 2>&1
  status=$?
  local took=$((SECONDS - start)) verdict
  case $status in
    0) verdict=ok ;;
    124 | 137) verdict="timed out after ${limit}s" ;;
    *) verdict="failed (exit $status)" ;;
  esac
  ROWS+=("| $name | $verdict | $took |")
  tail -n 3 "$LOGS/$name.log" | sed 's/^/    /' >&2
  return $status
}

# ---- The machine ---------------------------------------------------------------------------
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
  python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  GPU=1
fi
{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
  echo
  echo '```'
  if [ "$GPU" = 1 ]; then nvidia-smi -L; else echo "no GPU: CUDA steps run their CPU equivalents"; fi
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-",
    "tf32 cudnn", torch.backends.cudnn.allow_tf32)' 2>&1
  (command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1) || echo "no nvcc on PATH"
  echo "$(cmake --version | head -n 1); ninja $(ninja --version 2>/dev/null || echo missing); $(c++ --version | head -n 1)"
  echo '```'
} >"$SUMMARY" 2>&1
if [ ! -f "$KIT/MANIFEST" ]; then
  say "error: the device kit is missing at $KIT: run scripts/device-kit.sh and carry .device-kit"
  cp "$SUMMARY" "$OUT/"
  exit 1
fi

# ---- Build: the image's torch and the kit, nothing else -------------------------------------
TORCH_CMAKE=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GENERATOR=Ninja
command -v ninja >/dev/null || GENERATOR="Unix Makefiles"
step build 300 "cmake -S . -B '$BUILD' -G '$GENERATOR' -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_TESTING=ON -DDPTRAIN_WERROR=OFF -DDPTRAIN_PLOT_RENDER_TEST=OFF -DCMAKE_PREFIX_PATH='$TORCH_CMAKE;$KIT/prefix' \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST='$KIT/src/googletest' \
    -DCMAKE_CUDA_COMPILER='$NVCC' -DTORCH_CUDA_ARCH_LIST=9.0 \
  && cmake --build '$BUILD' -j $JOBS --target dptrain_app dptrain_tests"
BUILT=$?
DPTRAIN=$BUILD/app/dptrain
TESTS=$BUILD/tests/dptrain_tests

# The book's data-parallel runs, or their CPU stand-ins: one GPU, batch 256, lr 0.1, 10 epochs.
if [ "$GPU" = 1 ]; then
  DEVICES="--gpus 1"
  BOOK="--batch-size 256 --lr 0.1 --epochs 10"
  PEER="--device cuda --epochs 10 --batch-size 256 --lr 0.1 --width 64"
  NCCL_ONE="--gpus 1 --backend nccl --epochs 2 --check-replicas 50"
  FAULTS='NcclProcesses.*:GlooCudaProcesses.*'
else
  # One OpenMP thread per process: a few shared cores, oversubscribed by several spinning
  # threads per process, run LibTorch 2.11's CPU kernels many times slower.
  export OMP_NUM_THREADS=1
  DEVICES="--devices cpu --width 8 --memory-format contiguous --train-limit 2048 --test-limit 500"
  BOOK="--batch-size 256 --lr 0.1 --epochs 2"
  PEER="--device cpu --threads 1 --epochs 2 --batch-size 256 --lr 0.1 --width 8 --train-limit 2048 --test-limit 500"
  NCCL_ONE="--devices cpu --width 8 --memory-format contiguous --backend gloo --epochs 1 --train-limit 1024 --test-limit 256 --check-replicas 2"
  FAULTS='NcclProcesses.*:GlooCudaProcesses.*:MultiProcess.KilledRankMakesTheOtherFailWithinTheTimeout'
fi
TESTS_FILTER='Cuda*.*:NcclWorldOfOne.*:Reducer.EveryParameterAndGradientIs256ByteAligned:Communicator.*:NcclEnvironment.*:CheckWorld.*:CheckPlacements.*:Replicas.OneReplicaWithItsProcessGroupGivesTheSameBits'

if [ "$BUILT" = 0 ]; then
  step tests 150 "'$TESTS' --gtest_filter='$TESTS_FILTER' --gtest_color=no"
  step book-fp32 90 "'$DPTRAIN' train $DEVICES $BOOK --data-dir '$DATA' --metrics '$OUT/dptrain-fp32.jsonl'"
  step book-bf16 90 "'$DPTRAIN' train $DEVICES $BOOK --amp bf16 --data-dir '$DATA' --metrics '$OUT/dptrain-bf16.jsonl'"
fi
step peer-tuned 120 "python3 bench/pytorch_peer.py $PEER --channels-last --amp bf16 --cudnn-benchmark --gpu-data --data-dir '$DATA' | tee '$OUT/peer-tuned.jsonl'"
if [ "$BUILT" = 0 ]; then
  step faults 120 "'$TESTS' --gtest_filter='$FAULTS' --gtest_color=no"
  step nccl-one 60 "'$DPTRAIN' train $NCCL_ONE --timeout 60 --data-dir '$DATA'"
fi
step peer-book 150 "python3 bench/pytorch_peer.py $PEER --data-dir '$DATA' | tee '$OUT/peer-book.jsonl'"

# ---- Summary ---------------------------------------------------------------------------------
{
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "Found at configure time:"
  echo '```'
  grep -E 'dptrain: |Found CUDA|PyTorch: CUDA|Found Torch|Found ZLIB' "$LOGS/build.log" 2>/dev/null || echo "(no build log)"
  grep -E ' error|Error' "$LOGS/build.log" 2>/dev/null | head -n 5
  echo '```'
  for log in tests faults; do
    [ -f "$LOGS/$log.log" ] || continue
    echo "$log:"
    echo '```'
    # gtest's totals, each skip's reason counted, each failure's place, and the tests' notes.
    grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?' "$LOGS/$log.log"
    grep -A1 ': Skipped$' "$LOGS/$log.log" | grep -vE ': Skipped$|^--$' | sort | uniq -c |
      sed 's/^ */skipped: /'
    grep -E ': Failure$|^\[  FAILED  \] [A-Za-z]|^\[ note \]' "$LOGS/$log.log" | head -n 30
    echo '```'
  done
  for run in book-fp32 book-bf16 nccl-one; do
    [ -f "$LOGS/$run.log" ] || continue
    echo "$run: $([ "$GPU" = 1 ] || echo '(CPU stand-in) ')"
    echo '```'
    grep -E '^epoch [0-9]+/|^median of|^test acc|error:' "$LOGS/$run.log" | tail -n 13
    echo '```'
  done
  python3 bench/gpu_summary.py "$OUT" 2>&1
  [ "$GPU" = 1 ] || echo "no GPU here: every CUDA step above was skipped: no GPU, and ran its CPU equivalent"
  echo "total: $((SECONDS - BEGIN)) s of a ${BUDGET} s budget"
} >>"$SUMMARY"

cp "$SUMMARY" "$OUT/summary.md"
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
cat "$OUT/summary.md"
rm -rf "$LOGS"
# Exit status: the build's, then whether every step passed.
grep -qE '\| (failed|timed out)' "$OUT/summary.md" && exit 1
exit 0
