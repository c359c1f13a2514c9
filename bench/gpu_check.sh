#!/usr/bin/env bash
# The one command for the GPU machine (a rare 15-minute loan): builds dptrain against the image's
# PyTorch with only the device kit (scripts/device-kit.sh, carried as .device-kit) and runs, most
# valuable first, each step under its own cap (seconds, times DPTRAIN_CHECK_SCALE) and all
# within DPTRAIN_CHECK_BUDGET seconds (470 by default: the tool allows 600 s per command):
#   build                        300  dptrain_app; on failure again with toolkit hints, then
#                                     with DPTRAIN_NCCL=OFF (300 each, within what is left)
#   book-fp32, book-bf16      90, 75  the book's one-GPU run: 10 epochs, batch 256, lr 0.1
#   peer-tuned-fp32, -bf16    90, 75  bench/pytorch_peer.py tuned, 10 epochs, each precision
#   graph-bf16                    75  book-bf16 with --cuda-graph
#   build-tests, test-graph  180, 45  dptrain_tests; then the CUDA graph tests on their own
#   cuda-tests                   120  tests/integration/test_cuda.cpp's and the communicator's tests
#   nccl-one, syncbn-on, -off 45, 40, 40  a world of one on NCCL; sync-bn against none (bf16)
#   faults, test-stuck        90, 30  killed ranks; the stuck collective, alone and last
#   peer-book                     60  the peer as the book writes it, 3 epochs
# A step starts only with a third of its cap left; otherwise it is "skipped: out of time".
# After every step, and on any exit (a trap on EXIT, TERM and INT), it writes summary.md (one
# pass/fail line per target, bench/gpu_summary.py) and logs.tar.gz (every log, per-epoch record
# and nvidia-smi sample so far) to $OUT: two files, so a call killed at the tool's limit still
# returns what ran. It prints the summary last. Exit status: 0 when every step passed and every
# target was met, 1 when a step did not pass (failed, timed out, skipped or never reached), 2
# when only targets were missed; 130 or 143 when interrupted.
# Without a GPU (scripts/rehearse-device.sh) each CUDA step runs its CPU stand-in instead and
# the GPU targets are marked N/A, so that everything but the GPU itself is exercised.
#
#   device tool: run(command="bash bench/gpu_check.sh", carry=[".device-kit"], timeout_s=560)
#
# Environment: DPTRAIN_CHECK_BUDGET (seconds), DPTRAIN_CHECK_SCALE (multiplies every cap, may be
# a fraction: 2 shared cores need ~15), DPTRAIN_CHECK_JOBS, DPTRAIN_CHECK_BUILD_DIR, DPTRAIN_KIT,
# and DPTRAIN_CHECK_GPU=auto|0|1 (bench/gpu_check_selftest.sh forces it with stub programs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-check-out}
KIT=$(realpath -m "${DPTRAIN_KIT:-.device-kit}")
BUDGET=${DPTRAIN_CHECK_BUDGET:-470}
SCALE=${DPTRAIN_CHECK_SCALE:-1}
JOBS=${DPTRAIN_CHECK_JOBS:-$(nproc)}
BUILD=${DPTRAIN_CHECK_BUILD_DIR:-build-gpu-check}
RESERVE=15  # seconds kept back: a timed-out step's --kill-after (10) and the last summary
mkdir -p "$OUT"
LOGS=$(mktemp -d)
BEGIN=$SECONDS
DATA=$KIT/data/fashion-mnist
DPTRAIN=$BUILD/app/dptrain
TESTS=$BUILD/tests/dptrain_tests
export DPTRAIN_DATA=$DATA PYTHONUNBUFFERED=1
export BUILD JOBS KIT DPTRAIN TESTS LOGS

# ---- Step bookkeeping ---------------------------------------------------------------------------
# Every step, run or not, ends as one row: its verdict, seconds and whether it passed. The rows
# live in the associative arrays below and in $LOGS/steps.tsv (gpu_summary.py reads that).
PLAN=(build book-fp32 book-bf16 peer-tuned-fp32 peer-tuned-bf16 graph-bf16 build-tests test-graph
  cuda-tests nccl-one syncbn-on syncbn-off faults test-stuck peer-book)
SAMPLED=" book-fp32 book-bf16 peer-tuned-fp32 peer-tuned-bf16 graph-bf16 peer-book "
declare -A VERDICT=() TOOK=() PASSED=()
ORDER=()           # the steps in the order they got a row
CURRENT=""         # the step running now, for the trap
CURRENT_START=0
CHILD=""           # its `timeout` process, which leads the step's own process group
SAMPLER=""         # the background nvidia-smi of a sampled step
STOPPED_BY=""      # the signal that ended the check, if one did
FINISHED=0         # 1 once on_exit writes the last summary
CHECKS_STATUS=1    # gpu_summary.py's: 0 when every applicable target passed
BUILD_USED="none yet"

record() {  # record NAME VERDICT SECONDS PASSED(0|1)
  [ -n "${VERDICT[$1]+set}" ] || ORDER+=("$1")
  VERDICT[$1]=$2 TOOK[$1]=$3 PASSED[$1]=$4
  local name
  for name in "${ORDER[@]}"; do
    printf '%s\t%s\t%s\t%s\n' "$name" "${VERDICT[$name]}" "${TOOK[$name]}" "${PASSED[$name]}"
  done >"$LOGS/steps.tsv"
}

scaled() { awk -v c="$1" -v s="$SCALE" 'BEGIN { printf "%d", c * s + 0.5 }'; }
seconds_left() { echo $((BUDGET - RESERVE - (SECONDS - BEGIN))); }

# step NAME CAP COMMAND...: runs COMMAND (a program or an exported function, which finds the
# step's name in $STEP_NAME) under min(CAP * SCALE, time left), logging to $LOGS/NAME.log,
# sampling the GPU if NAME is in $SAMPLED, and records its row. With less than a third of its
# cap left a step does not start: the time goes to the shorter steps after it, and its row says
# "skipped: out of time", which counts as not passed. The command runs in the background so
# that a TERM reaches the trap at once (bash defers traps while a foreground child runs).
# Returns the command's status (99 when skipped).
step() {
  local name=$1 cap
  cap=$(scaled "$2")
  shift 2
  local left floor limit
  left=$(seconds_left)
  floor=$((cap / 3 > 1 ? cap / 3 : 1))
  if [ "$left" -lt "$floor" ]; then
    left=$((left > 0 ? left : 0))
    record "$name" "skipped: out of time ($left s left, a third of its $cap s cap needed)" 0 0
    write_summary
    return 99
  fi
  limit=$((cap < left ? cap : left))
  echo "== $name (up to ${limit} s)" >&2
  CURRENT=$name CURRENT_START=$SECONDS
  case $SAMPLED in *" $name "*) start_sampler "$name" ;; esac
  write_summary  # a kill from now on shows this step as the one running
  # shellcheck disable=SC2016  # "$@" is the inner bash's: the command and its arguments
  STEP_NAME=$name timeout --kill-after=10 "$limit" bash -o pipefail -c '"$@"' "$name" "$@" \
    >"$LOGS/$name.log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  local status=$? took=$((SECONDS - CURRENT_START)) verdict
  CHILD="" CURRENT=""
  stop_sampler
  case $status in
    0) verdict=ok ;;
    124 | 137) verdict="timed out after ${limit} s" ;;
    *) verdict="failed (exit $status)" ;;
  esac
  record "$name" "$verdict" "$took" $((status == 0 ? 1 : 0))
  tail -n 3 "$LOGS/$name.log" | sed 's/^/    /' >&2
  write_summary
  return "$status"
}

# not_run NAME WHY: a step that cannot run (its build failed): a row, counted as not passed.
not_run() {
  record "$1" "skipped: $2" 0 0
  write_summary
}

# ---- nvidia-smi in the background ---------------------------------------------------------------
# Utilisation, SM clock and power every 0.5 s during the training runs: a busy GPU at full clock
# is the bound; a GPU idle much of the time means the host (launches, data, syncs) is.
start_sampler() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits \
    -lms 500 >"$LOGS/$1.smi.csv" 2>&1 &
  SAMPLER=$!
}

stop_sampler() {
  [ -n "$SAMPLER" ] || return 0
  kill "$SAMPLER" 2>/dev/null
  wait "$SAMPLER" 2>/dev/null
  SAMPLER=""
}

# ---- The summary, rewritten after every step ----------------------------------------------------

state_line() {
  local elapsed=$((SECONDS - BEGIN))
  if [ -n "$STOPPED_BY" ]; then
    echo "**Stopped by $STOPPED_BY** after $elapsed s; the steps after it were never reached."
  elif [ -n "$CURRENT" ]; then
    echo "**In progress** ($elapsed s of $BUDGET): running $CURRENT; rewritten after every step."
  elif [ "$FINISHED" = 1 ]; then
    echo "Finished in $elapsed s of a $BUDGET s budget (caps scaled by $SCALE)."
  else
    echo "**In progress** ($elapsed s of $BUDGET)."
  fi
}

steps_table() {
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  local name mark
  for name in "${ORDER[@]}"; do
    mark=$([ "${PASSED[$name]}" = 1 ] || echo ' **(not passed)**')
    echo "| $name | ${VERDICT[$name]}$mark | ${TOOK[$name]} |"
  done
  for name in "${PLAN[@]}"; do
    [ -z "${VERDICT[$name]+set}" ] || continue
    if [ "$name" = "$CURRENT" ]; then
      echo "| $name | running for $((SECONDS - CURRENT_START)) s |  |"
    else
      echo "| $name | not reached **(not passed)** |  |"
    fi
  done
}

# The logs' telling lines: gtest's totals, skips, failures and notes, and the test a crash hit;
# the last two of dptrain's epoch lines ("epoch 3/10: train loss ...", not the progress lines
# "epoch 3/10 step 50/235: ..." on stderr), its median and final lines, and its errors.
log_details() {
  local name log
  for name in build build-hints build-no-nccl; do
    log=$LOGS/$name.log
    [ -f "$log" ] || continue
    echo "$name, found at configure time:"
    echo '```'
    grep -E 'dptrain: |Found CUDA|PyTorch: CUDA|Found Torch|Found ZLIB| error|Error' "$log" |
      head -n 20
    echo '```'
  done
  for name in test-graph cuda-tests faults test-stuck; do
    log=$LOGS/$name.log
    [ -f "$log" ] || continue
    echo "$name:"
    echo '```'
    grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?|^\[  SKIPPED \] [0-9]+ tests?' "$log"
    grep -A1 ': Skipped$' "$log" | grep -vE ': Skipped$|^--$' | sort | uniq -c | sed 's/^ */skipped: /'
    grep -E ': Failure$|^\[  FAILED  \] [A-Za-z]|^\[ note \]|^error: ' "$log" | head -n 30
    awk '/^\[ RUN      \]/ { t = $NF } /^\[ +(OK|SKIPPED) \]|^\[  FAILED  \] [A-Za-z]/ { t = "" }
      END { if (t != "") print "ended inside: " t }' "$log"
    echo '```'
  done
  for name in book-fp32 book-bf16 graph-bf16 nccl-one syncbn-on syncbn-off; do
    log=$LOGS/$name.log
    [ -f "$log" ] || continue
    echo "$name$([ "$GPU" = 1 ] || echo ' (CPU stand-in)'):"
    echo '```'
    grep -E '^epoch [0-9]+/[0-9]+: ' "$log" | tail -n 2
    grep -E '^median of epochs|^test acc: |error:|refused' "$log" | head -n 6
    echo '```'
  done
}

# Writes $OUT/summary.md and $OUT/logs.tar.gz whole (a file written aside, then renamed), so
# that whatever ends the call leaves the last complete pair behind.
write_summary() {
  local part=$OUT/.summary.md.part
  local no_gpu=()
  [ "$GPU" = 1 ] || no_gpu=(--no-gpu)
  {
    cat "$LOGS/machine.md"
    echo
    state_line
    echo
    echo "Build used: $BUILD_USED."
    echo
    steps_table
    echo
    python3 bench/gpu_summary.py "$LOGS" --book-epochs "$BOOK_EPOCHS" "${no_gpu[@]}"
    CHECKS_STATUS=$?
    echo
    echo "## From the logs"
    echo
    log_details
    echo "total: $((SECONDS - BEGIN)) s of a $BUDGET s budget"
  } >"$part" 2>&1
  mv -f "$part" "$OUT/summary.md"
  tar --warning=no-file-changed -czf "$OUT/.logs.tar.gz.part" -C "$LOGS" . 2>/dev/null
  mv -f "$OUT/.logs.tar.gz.part" "$OUT/logs.tar.gz"
}

# ---- Ending: normally, or by a signal -----------------------------------------------------------

on_signal() {  # on_signal NAME STATUS
  trap '' TERM INT
  STOPPED_BY=SIG$1
  if [ -n "$CHILD" ]; then
    kill -TERM -- "-$CHILD" 2>/dev/null  # timeout leads its own process group
    for _ in 1 2 3 4 5 6 7 8 9 10; do  # 3 s for the step to end on TERM
      kill -0 "$CHILD" 2>/dev/null || break
      sleep 0.3
    done
    kill -KILL -- "-$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    CHILD=""
  fi
  stop_sampler
  if [ -n "$CURRENT" ]; then
    local took=$((SECONDS - CURRENT_START))
    record "$CURRENT" "killed by SIG$1 after $took s" "$took" 0
    tail -n 3 "$LOGS/$CURRENT.log" 2>/dev/null | sed 's/^/    /' >&2
    CURRENT=""
  fi
  exit "$2"  # on_exit writes the summary
}

on_exit() {
  local status=$?
  trap '' TERM INT
  trap - EXIT
  stop_sampler
  FINISHED=1
  write_summary
  cat "$OUT/summary.md"
  # The tool shows the output's tail: end with the rows and the verdicts.
  echo
  echo "---- recap ----"
  steps_table
  sed -n '/^## Targets/,/^checks passed/p' "$OUT/summary.md" | grep -E '^- \[|^checks passed'
  rm -rf "$LOGS"
  if [ -n "$STOPPED_BY" ]; then exit "$status"; fi
  local name
  for name in "${PLAN[@]}" "${ORDER[@]}"; do
    [ "${PASSED[$name]:-0}" = 1 ] || exit 1
  done
  [ "$CHECKS_STATUS" = 0 ] || exit 2
  exit 0
}

# ---- The machine --------------------------------------------------------------------------------
GPU=${DPTRAIN_CHECK_GPU:-auto}
if [ "$GPU" = auto ]; then
  GPU=0
  python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && GPU=1
fi
BOOK_EPOCHS=10
[ "$GPU" = 1 ] || BOOK_EPOCHS=2
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT
trap on_exit EXIT
{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
  echo
  echo '```'
  if [ "$GPU" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 ||
      echo "no nvidia-smi: the GPU is not sampled"
  else
    echo "no GPU: CUDA steps run their CPU stand-ins; the GPU targets are N/A"
  fi
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-",
    "tf32 cudnn", torch.backends.cudnn.allow_tf32)' 2>&1 | tail -n 1
  (command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1) || echo "no nvcc on PATH"
  echo "$(cmake --version | head -n 1); ninja $(ninja --version 2>/dev/null || echo missing); $(c++ --version | head -n 1)"
  echo '```'
  echo
  echo "Environment (NCCL_*, TORCH_NCCL_*, CUDA_*); the test binary runs with"
  echo "TORCH_NCCL_ASYNC_ERROR_HANDLING and NCCL_ASYNC_ERROR_HANDLING unset:"
  echo '```'
  env | grep -E '^(NCCL_|TORCH_NCCL_|CUDA_)' | sort || true
  env | grep -qE '^(NCCL_|TORCH_NCCL_|CUDA_)' || echo "(none set)"
  echo '```'
} >"$LOGS/machine.md" 2>&1
if [ ! -f "$KIT/MANIFEST" ]; then
  BUILD_USED="none: the device kit is missing at $KIT (run scripts/device-kit.sh and carry .device-kit)"
  not_run build "no device kit at $KIT"
  exit 1
fi

# ---- Build: the image's torch and the kit, nothing else -----------------------------------------
TORCH_CMAKE=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GENERATOR=Ninja
command -v ninja >/dev/null || GENERATOR="Unix Makefiles"
export TORCH_CMAKE NVCC GENERATOR

# build_attempt CMAKE_ARGS...: configure from a fresh cache (a failed probe stays cached
# otherwise), keeping the object files that an unchanged command line can reuse, then build
# dptrain alone: the book runs need nothing more, and the tests build later.
build_attempt() {
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  cmake -S . -B "$BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
    -DDPTRAIN_WERROR=OFF -DDPTRAIN_PLOT_RENDER_TEST=OFF -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$KIT/prefix" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$KIT/src/googletest" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DTORCH_CUDA_ARCH_LIST=9.0 "$@" &&
    cmake --build "$BUILD" -j "$JOBS" --target dptrain_app
}

# The folder of nccl.h in PyPI's NVIDIA wheels (the `nvidia` namespace package), if any.
nccl_include_dir() {
  python3 - <<'EOF' 2>/dev/null
import glob, os, sys
import nvidia
for root in list(nvidia.__path__):
    found = glob.glob(os.path.join(root, "nccl", "include", "nccl.h")) + \
        sorted(glob.glob(os.path.join(root, "**", "nccl.h"), recursive=True))
    if found:
        print(os.path.dirname(found[0]))
        sys.exit(0)
sys.exit(1)
EOF
}

# A configure or compile failure gets two more tries, so that the book runs still happen: with
# the toolkit's and NCCL's places spelled out, then without NCCL (CUDA only). A timed-out or
# skipped attempt is not retried: the next would not be faster.
build_dptrain() {
  BUILD_USED="none: the build failed"
  step build 300 build_attempt && { BUILD_USED="the default"; return 0; }
  retry_after build || return 1
  local hints=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(realpath -m "$NVCC")")")") nccl
  nccl=$(nccl_include_dir) && hints+=("-DDPTRAIN_NCCL_INCLUDE_DIR=$nccl")
  step build-hints 300 build_attempt "${hints[@]}" &&
    { BUILD_USED="the retry with toolkit hints (${hints[*]})"; return 0; }
  retry_after build-hints || return 1
  step build-no-nccl 300 build_attempt "${hints[@]}" -DDPTRAIN_NCCL=OFF &&
    {
      BUILD_USED="the retry without NCCL, CUDA only (${hints[*]} -DDPTRAIN_NCCL=OFF): the NCCL"
      BUILD_USED+=" steps cannot pass"
      return 0
    }
  return 1
}

retry_after() {  # retry_after NAME: true when NAME failed outright, marking its row as retried
  case ${VERDICT[$1]} in failed*) ;; *) return 1 ;; esac
  record "$1" "${VERDICT[$1]}; retried" "${TOOK[$1]}" 0
}
export -f build_attempt

# ---- What each step runs: the GPU's, or the CPU stand-in's --------------------------------------
if [ "$GPU" = 1 ]; then
  DEVICES=(--gpus 1)
  PEER=(--device cuda --batch-size 256 --lr 0.1 --width 64)
  PEER_BOOK_EPOCHS=3
  NCCL_ONE=(--gpus 1 --backend nccl --epochs 2 --check-replicas 50)
  # One step of batch 256 (gpu_summary.py: SYNC_BN_BOUND); cuDNN's benchmark off so that the two
  # runs pick the same kernels.
  SYNC=(--gpus 1 --backend nccl --amp bf16 --cudnn-benchmark off --epochs 1 --max-steps 1
    --train-limit 2560 --test-limit 2560)
  FAULTS='NcclProcesses.*:GlooCudaProcesses.*'
else
  # One OpenMP thread per process: a few shared cores, oversubscribed by several spinning
  # threads per process, run LibTorch 2.11's CPU kernels many times slower.
  export OMP_NUM_THREADS=1
  DEVICES=(--devices cpu --width 8 --memory-format contiguous --train-limit 2048 --test-limit 500)
  PEER=(--device cpu --threads 1 --batch-size 256 --lr 0.1 --width 8 --train-limit 2048 --test-limit 500)
  PEER_BOOK_EPOCHS=2
  NCCL_ONE=(--devices cpu --width 8 --memory-format contiguous --backend gloo --epochs 1
    --train-limit 1024 --test-limit 256 --check-replicas 2)
  SYNC=(--devices cpu --width 8 --memory-format contiguous --backend gloo --amp bf16 --epochs 1
    --max-steps 1 --train-limit 1024 --test-limit 256)
  FAULTS='NcclProcesses.*:GlooCudaProcesses.*:MultiProcess.KilledRankMakesTheOtherFailWithinTheTimeout'
fi
BOOK=(--batch-size 256 --lr 0.1 --epochs "$BOOK_EPOCHS" --data-dir "$DATA")
PEER+=(--data-dir "$DATA")
PEER_TUNED=(--channels-last --cudnn-benchmark --gpu-data)
STUCK=NcclWorldOfOne.StuckCollectiveEndsInACollectiveErrorWithinTheTimeout
# tests/train/test_cuda_graph.cpp: the parameterised suite is instantiated as Steps/CudaGraph.*, which
# the plain 'CudaGraph.*' does not match (gtest matches the whole name), and the usage checks.
GRAPH_TESTS='*CudaGraph.*:CudaGraphUsage.*'
CUDA_TESTS="Cuda*.*:NcclWorldOfOne.*:Reducer.EveryParameterAndGradientIs256ByteAligned:Communicator.*"
CUDA_TESTS+=":NcclEnvironment.*:CheckWorld.*:CheckPlacements.*:Replicas.OneReplicaWithItsProcessGroupGivesTheSameBits"
CUDA_TESTS+="-$STUCK:$GRAPH_TESTS"  # each runs on its own

# peer ARGS...: the PyTorch peer, its JSON lines kept as the step's records.
peer() {
  python3 bench/pytorch_peer.py "$@" | tee "$LOGS/$STEP_NAME.jsonl"
}

# gtest FILTER: the test binary without the NCCL error-handling variables, which at 1 or 3 make
# LibTorch end the whole process inside the stuck-collective test and lose every later test. A
# filter that matches no test fails: nothing was checked.
gtest() {
  env -u TORCH_NCCL_ASYNC_ERROR_HANDLING -u NCCL_ASYNC_ERROR_HANDLING \
    "$TESTS" --gtest_filter="$1" --gtest_color=no
  local status=$?
  if grep -q '^\[==========\] 0 tests from' "$LOGS/$STEP_NAME.log"; then
    echo "error: no test matches --gtest_filter=$1"
    status=1
  fi
  return "$status"
}

# The CPU stand-in of the CUDA graph run: dptrain must refuse --cuda-graph on the CPU as a usage
# error naming the flag (exit 2, not "unexpected argument"); the run without it gives the records.
graph_stand_in() {
  "$DPTRAIN" train "$@" --cuda-graph
  local status=$?
  if [ "$status" != 2 ] || ! grep -q 'cuda-graph' "$LOGS/$STEP_NAME.log" ||
    grep -q 'unexpected argument' "$LOGS/$STEP_NAME.log"; then
    echo "error: expected --cuda-graph refused on the CPU as a usage error (exit 2); got $status"
    return 1
  fi
  echo "(stand-in: --cuda-graph refused on cpu, as it should be; the same run without it)"
  "$DPTRAIN" train "$@"
}
export -f peer gtest graph_stand_in

# ---- The steps, most valuable first -------------------------------------------------------------
BUILT=0 TESTS_BUILT=0
build_dptrain && BUILT=1
dptrain_step() {  # dptrain_step NAME CAP ARGS...: a dptrain run, when dptrain was built
  if [ "$BUILT" = 1 ]; then
    step "$1" "$2" "$DPTRAIN" train "${@:3}"
  else
    not_run "$1" "no dptrain build"
  fi
}
dptrain_step book-fp32 90 "${DEVICES[@]}" "${BOOK[@]}" --metrics "$LOGS/book-fp32.jsonl"
dptrain_step book-bf16 75 "${DEVICES[@]}" "${BOOK[@]}" --amp bf16 --metrics "$LOGS/book-bf16.jsonl"
step peer-tuned-fp32 90 peer "${PEER[@]}" "${PEER_TUNED[@]}" --epochs "$BOOK_EPOCHS"
step peer-tuned-bf16 75 peer "${PEER[@]}" "${PEER_TUNED[@]}" --amp bf16 --epochs "$BOOK_EPOCHS"
GRAPH_ARGS=("${DEVICES[@]}" "${BOOK[@]}" --amp bf16 --metrics "$LOGS/graph-bf16.jsonl")
if [ "$BUILT" != 1 ]; then
  not_run graph-bf16 "no dptrain build"
elif [ "$GPU" = 1 ]; then
  step graph-bf16 75 "$DPTRAIN" train "${GRAPH_ARGS[@]}" --cuda-graph
else
  step graph-bf16 75 graph_stand_in "${GRAPH_ARGS[@]}"
fi

if [ "$BUILT" = 1 ]; then
  step build-tests 180 cmake --build "$BUILD" -j "$JOBS" --target dptrain_tests && TESTS_BUILT=1
else
  not_run build-tests "no dptrain build"
fi
test_step() {  # test_step NAME CAP FILTER: a gtest run, when the tests were built
  if [ "$TESTS_BUILT" = 1 ]; then
    step "$1" "$2" gtest "$3"
  else
    not_run "$1" "the tests did not build"
  fi
}
test_step test-graph 45 "$GRAPH_TESTS"
test_step cuda-tests 120 "$CUDA_TESTS"
dptrain_step nccl-one 45 "${NCCL_ONE[@]}" --timeout 60 --data-dir "$DATA"
SYNC+=(--data-dir "$DATA")
dptrain_step syncbn-on 40 "${SYNC[@]}" --sync-bn --metrics "$LOGS/syncbn-on.jsonl"
dptrain_step syncbn-off 40 "${SYNC[@]}" --metrics "$LOGS/syncbn-off.jsonl"
test_step faults 90 "$FAULTS"
test_step test-stuck 30 "$STUCK"  # last among the tests: a fatal ending loses nothing after it
step peer-book 60 peer "${PEER[@]}" --epochs "$PEER_BOOK_EPOCHS"
# on_exit writes the last summary, prints it and sets the exit status.
