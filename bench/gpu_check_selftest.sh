#!/usr/bin/env bash
# Tests bench/gpu_check.sh's own logic without a GPU, a build or torch, in well under a minute:
# stub programs early on $PATH (cmake, nvidia-smi, python3 for the peer only) and stub dptrain
# and dptrain_cuda_tests that print dptrain's and GoogleTest's real line formats. Each scenario
# runs the check into a temporary $OUT, side by side with the others, and then greps its
# summary.md, logs.tar.gz and exit status. Not here: anything about the real programs
# (scripts/rehearse-device.sh runs the real build and steps without a GPU).
#
#   bash bench/gpu_check_selftest.sh        # prints one line per expectation; exit 1 on a miss
#   DPTRAIN_SELFTEST_KEEP=/tmp/st bash bench/gpu_check_selftest.sh   # keeps every scenario's files
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CHECK=$PWD/bench/gpu_check.sh
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAKE=$WORK/fake
mkdir -p "$FAKE/bin" "$FAKE/nosmi"
MISSES=0
EXPECTED=0

# ---- Stub programs ------------------------------------------------------------------------------

# cmake: the configure remembers its arguments in the build folder and fails unless they hold
# $FAKE_CONFIGURE_NEEDS. --build of dptrain_app alone fails, as Ninja prints a failed compile
# (the command line names NCCL's wheel and -Werror), unless the configure's arguments hold
# $FAKE_BUILD_NEEDS; then it installs the stub dptrain and lingers FAKE_APP_LINGER seconds (a
# slow tail after the link). --build of dptrain_cuda_tests wants a keep-going argument, takes
# FAKE_TESTS_BUILD_SLEEP seconds (files still compiling) and installs the stub tests unless
# FAKE_TESTS_FAIL is set. Every call is logged to $FAKE_STATE/cmake.calls.
cat >"$FAKE/bin/cmake" <<'EOF'
#!/usr/bin/env bash
if [ "$1" = --version ]; then echo "cmake version 0.0 (stub)"; exit 0; fi
echo "$*" >>"$FAKE_STATE/cmake.calls"
if [ "$1" = --build ]; then
  dir=$2 args=" $* "
  if [[ $args == *" --target dptrain_cuda_tests -- -k "* ]]; then
    sleep "${FAKE_TESTS_BUILD_SLEEP:-0}"
    if [ -n "${FAKE_TESTS_FAIL:-}" ]; then
      echo "FAILED: tests/CMakeFiles/dptrain_cuda_tests.dir/integration/test_cuda.cpp.o"
      echo "tests/integration/test_cuda.cpp:42:3: error: 'spawn_command' was not declared in this scope (stub)"
      exit 1
    fi
    mkdir -p "$dir/tests" && cp "$FAKE/dptrain_tests" "$dir/tests/dptrain_cuda_tests"
    echo "[1/1] Linking CXX executable tests/dptrain_cuda_tests (stub)"
    exit 0
  fi
  [[ $args == *" --target dptrain_app " ]] ||
    { echo "stub cmake: wanted --target dptrain_app alone, or dptrain_cuda_tests -- -k: $*"; exit 3; }
  sleep "${FAKE_BUILD_SLEEP:-0}"
  if [ -n "${FAKE_BUILD_NEEDS:-}" ] && ! grep -q -- "$FAKE_BUILD_NEEDS" "$dir/stub-configure-args"; then
    file=${FAKE_BUILD_ERROR%%:*}
    echo "FAILED: lib/CMakeFiles/dptrain.dir/${file##*/}.o"
    echo "/usr/bin/c++ -DDPTRAIN_WITH_NCCL=1 -I/venv/nvidia/nccl/include -Werror=return-type -O3 -c $file"
    echo "$FAKE_BUILD_ERROR"
    echo "ninja: build stopped: subcommand failed."
    exit 1
  fi
  mkdir -p "$dir/app" && cp "$FAKE/dptrain" "$dir/app/dptrain"
  echo "[1/1] Linking CXX executable app/dptrain (stub)"
  sleep "${FAKE_APP_LINGER:-0}"
  exit 0
fi
while [ $# -gt 0 ]; do [ "$1" = -B ] && dir=$2; shift; done
mkdir -p "$dir" && echo "$(tail -n 1 "$FAKE_STATE/cmake.calls")" >"$dir/stub-configure-args"
if [ -n "${FAKE_CONFIGURE_NEEDS:-}" ] && ! grep -q -- "$FAKE_CONFIGURE_NEEDS" "$dir/stub-configure-args"; then
  echo "CMake Error at third_party/dependencies.cmake:1 (stub: needs $FAKE_CONFIGURE_NEEDS)"
  exit 1
fi
echo "-- dptrain: LibTorch 2.11.0 (stub)"
echo "-- dptrain: CUDA support: ON"
echo "-- dptrain: NCCL support (--backend nccl): ON, NCCL 2.28.9 (stub)"
EOF

# nvidia-smi: the query line, and with -lms two idle samples then busy ones until stopped.
cat >"$FAKE/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *-lms*)
    echo "0, 345, 80.10"; echo "0, 345, 80.20"
    while true; do echo "97, 1980, 455.50"; sleep 0.05; done ;;
  *) echo "name, driver_version, clocks.max.sm [MHz], power.limit [W]"
     echo "NVIDIA H200 (stub), 580.00, 1980, 700.00" ;;
esac
EOF

# python3: the peer prints its --epochs JSON lines; the pre-flight's torch script prints a
# stub torch's findings (CUDA as FAKE_CUDA says, 1 by default); anything else is the real python3.
REAL_PYTHON=$(command -v python3)
cat >"$FAKE/bin/python3" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = - ]; then
  script=\$(cat)
  case \$script in *"import torch.utils"*)
    echo "FOUND_CUDA=\${FAKE_CUDA:-1}"
    echo "TORCH_CMAKE=/stub/torch/share/cmake"
    echo "TORCH_LINE='torch 2.11.0 (stub)'"
    exit 0 ;;
  esac
  exec "$REAL_PYTHON" -c "\$script"
fi
[ "\${1:-}" = bench/pytorch_peer.py ] || exec "$REAL_PYTHON" "\$@"
exec "$REAL_PYTHON" "$FAKE/peer.py" "\$@"
EOF
cat >"$FAKE/peer.py" <<'EOF'
import json, os, sys, time
args = sys.argv[2:]
time.sleep(float(os.environ.get("FAKE_PEER_SLEEP", "0")))  # wall time the peer takes
epochs = int(args[args.index("--epochs") + 1])
tuned, bf16 = "--gpu-data" in args, "bf16" in args
seconds = (1.0 if bf16 else 2.0) if tuned else 3.0
seconds *= float(os.environ.get("FAKE_PEER_PACE", "1"))
for e in range(epochs):
    print(json.dumps({"epoch": e + 1, "seconds": seconds, "test_acc": round(0.89 + 0.01 * e, 4),
                      "images_per_second": 60000 / seconds}))
print(json.dumps({"epochs": epochs, "steady_seconds": seconds}))
EOF

# dptrain train: its arguments on stderr, progress lines on stderr, epoch lines on stdout,
# --metrics records (with the per-step times unless FAKE_OLD_RECORDS is set; no GPU time on the
# CPU), the median and final lines. Steps take 0.95 of their wall time on the GPU in fp32, 0.75
# with --cuda-graph, 0.5 in eager bf16. The test accuracy of the last three epochs is 0.9290,
# 0.9400 and 0.9360, 0.9000 before. --cuda-graph on cpu is a usage error (exit 2) as dptrain's
# check_cuda_graph has it; FAKE_CAPTURE_FAILS=always|benchmark makes the capture fail always or
# with cuDNN's benchmark on; FAKE_GRAPH_SLEEP slows a graph run. The step timer drops no sample
# and spins 3 ms an epoch; with FAKE_TIMER_DROPS it drops all 3 samples of every epoch (no GPU
# time) and spins 6 ms in the first (2 ms, then 4 ms once, then off) and none after, as
# dptrain's does for a step that waits on the host. FAKE_STALL_AFTER=N stalls the book-fp32 run after N epochs, until its cap.
cat >"$FAKE/dptrain" <<'EOF'
#!/usr/bin/env bash
echo $$ >>"$FAKE_STATE/dptrain.pids"
echo "(stub) dptrain $*" >&2
[ -z "${TORCH_SHOW_CPP_STACKTRACES:-}" ] || echo "(stub) TORCH_SHOW_CPP_STACKTRACES=$TORCH_SHOW_CPP_STACKTRACES" >&2
epochs=10 metrics="" amp=off graph=0 sync=0 cpu=0 benchmark=on
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=$2; shift ;;
    --metrics) metrics=$2; shift ;;
    --amp) amp=$2; shift ;;
    --cudnn-benchmark) benchmark=$2; shift ;;
    --cuda-graph) graph=1 ;;
    --sync-bn) sync=1 ;;
    --devices) [ "$2" = cpu ] && cpu=1; shift ;;
  esac
  shift
done
if [ "$graph" = 1 ] && [ "$cpu" = 1 ]; then
  echo "error: --cuda-graph needs CUDA devices: ... run without --cuda-graph" >&2
  exit 2
fi
if [ "$graph" = 1 ] && { [ "${FAKE_CAPTURE_FAILS:-}" = always ] ||
  { [ "${FAKE_CAPTURE_FAILS:-}" = benchmark ] && [ "$benchmark" = on ]; }; }; then
  echo "error: --cuda-graph: the training step could not be captured (operation not permitted when stream is capturing (stub)); run without --cuda-graph" >&2
  exit 1
fi
[ "$graph" = 0 ] || sleep "${FAKE_GRAPH_SLEEP:-0}"
steady=$([ "$amp" = bf16 ] && echo 0.40 || echo 0.90)
share=$([ "$amp" = bf16 ] && echo 0.5 || echo 0.95)
[ "$graph" = 0 ] || share=0.75
loss=$([ "$sync" = 1 ] && echo 0.812345 || echo 0.812400)
# "seconds rate wall_ms gpu_ms" of epoch 1 and of the others, worked out once
read -r first_line steady_line < <(awk -v s="$steady" -v g="$share" 'BEGIN {
  printf "3.0,%.0f,%.4f,%.4f ", 60000 / 3, 3000 / 235, 3000 / 235 * g
  printf "%s,%.0f,%.4f,%.4f\n", s, 60000 / s, s * 1000 / 235, s * 1000 / 235 * g }')
dropped=0 spin=3.0 sampled=0 dropped_all=0
[ -z "${FAKE_TIMER_DROPS:-}" ] || dropped=3 spin=6.0
for e in $(seq 1 "$epochs"); do
  if [ -n "${FAKE_STALL_AFTER:-}" ] && [ "$e" -gt "$FAKE_STALL_AFTER" ] &&
    [[ $metrics == */book-fp32.jsonl ]]; then
    sleep 600
  fi
  sleep "${FAKE_EPOCH_SLEEP:-0}"
  IFS=, read -r s rate wall gpu <<<"$([ "$e" = 1 ] && echo "$first_line" || echo "$steady_line")"
  case $((epochs - e)) in 0) acc=0.9360 ;; 1) acc=0.9400 ;; 2) acc=0.9290 ;; *) acc=0.9000 ;; esac
  [ "$cpu" = 0 ] || gpu=null
  [ "$dropped" = 0 ] || gpu=null
  [ "$dropped" = 0 ] || [ "$e" = 1 ] || spin=0.0
  sampled=$((sampled + 3)) dropped_all=$((dropped_all + dropped))
  echo "epoch $e/$epochs step 50/235: loss 9.9999, acc 0.1111, 1234 img/s, 3 s left" >&2
  echo "epoch $e/$epochs: train loss $loss, train acc 0.9000, test acc $acc, $s s, $rate img/s"
  per_step=",\"gpu_ms_per_step\":$gpu,\"wall_ms_per_step\":$wall"
  [ "$cpu" = 1 ] || per_step+=",\"gpu_samples_dropped\":$dropped,\"gpu_spin_ms\":$spin"
  [ -z "${FAKE_OLD_RECORDS:-}" ] || per_step=""
  [ -z "$metrics" ] || printf '{"epoch":%s,"train_loss":%s,"train_acc":0.9,"test_loss":0.25,%s%s}\n' \
    "$e" "$loss" "\"test_acc\":$acc,\"seconds\":$s,\"images_per_second\":$rate,\"devices\":\"cuda:0\"" \
    "$per_step" >>"$metrics"
done
echo "median of epochs 2-$epochs: $steady sec/epoch (epoch 1: 3 s)"
timer=""
[ "$cpu" = 1 ] || timer="; GPU timer: $dropped_all of $sampled samples dropped"
echo "test acc: $acc, 1.0 sec/epoch on [cuda:0]$timer"
EOF

# dptrain_cuda_tests: GoogleTest's lines. It fails when it sees the NCCL error-handling
# variables, aborts as LibTorch would when the stuck-collective test runs beside others (and in
# the CUDA tests when FAKE_CRASH is set), and matches no CudaGraph test when FAKE_NO_GRAPH_TESTS
# is set. FAKE_TESTS_SLEEP slows every run.
cat >"$FAKE/dptrain_tests" <<'EOF'
#!/usr/bin/env bash
sleep "${FAKE_TESTS_SLEEP:-0}"
filter=${1#--gtest_filter=}
stuck=NcclWorldOfOne.StuckCollectiveEndsInACollectiveErrorWithinTheTimeout
tests=(Suite.One Suite.Two)
[ "$filter" = "$stuck" ] && tests=("$stuck")
graph='*CudaGraph.*:CudaGraphUsage.*'
[ "$filter" = "$graph" ] && tests=(Steps/CudaGraph.ReplayedStepsMatchEagerStepsBitForBit/fp32)
[ "$filter" = "$graph" ] && [ -n "${FAKE_NO_GRAPH_TESTS:-}" ] && tests=()
echo "Note: Google Test filter = $filter"
echo "[==========] Running ${#tests[@]} tests from 1 test suite."
[ ${#tests[@]} -gt 0 ] || { echo "[==========] 0 tests from 0 test suites ran. (0 ms total)"; exit 0; }
if env | grep -qE '^(TORCH_NCCL_ASYNC_ERROR_HANDLING|NCCL_ASYNC_ERROR_HANDLING)='; then
  echo "[ RUN      ] NcclEnvironment.Unset"
  echo "stub.cpp:1: Failure"
  echo "[  FAILED  ] NcclEnvironment.Unset (0 ms)"
  echo "[  FAILED  ] 1 test, listed below:"
  exit 1
fi
if [[ -n ${FAKE_CRASH:-} && $filter == 'Cuda*'* ]]; then
  echo "[ RUN      ] CudaReplicas.TwoOnOneGpuOverGlooStayBitIdentical"
  exit 134
fi
if [[ $filter == *'NcclWorldOfOne.*'* && $filter != *"-$stuck"* ]]; then
  echo "[ RUN      ] $stuck"
  echo "terminate called: the watchdog ended the process (stub)"
  exit 134
fi
for t in "${tests[@]}"; do echo "[ RUN      ] $t"; echo "[       OK ] $t (1 ms)"; done
echo "[ RUN      ] CudaFastPath.SkippedHere"  # gtest's skip line has its own spacing
echo "[  SKIPPED ] CudaFastPath.SkippedHere (0 ms)"
echo "[  PASSED  ] ${#tests[@]} tests."
EOF
chmod +x "$FAKE"/bin/* "$FAKE/dptrain" "$FAKE/dptrain_tests"
ln -s "$FAKE/bin/cmake" "$FAKE/nosmi/cmake"
ln -s "$FAKE/bin/python3" "$FAKE/nosmi/python3"
mkdir -p "$WORK/kit"
touch "$WORK/kit/MANIFEST"

# ---- Running the check and looking at what it left ----------------------------------------------

# run_check NAME [VAR=VALUE...]: runs gpu_check.sh in scenario NAME (a folder of its own) with
# the stubs and the given environment; its exit status goes to $WORK/NAME/status.
run_check() {
  local name=$1
  shift
  mkdir -p "$WORK/$name/state"
  env PATH="$FAKE/bin:$PATH" FAKE="$FAKE" FAKE_STATE="$WORK/$name/state" OUT="$WORK/$name/out" \
    DPTRAIN_KIT="$WORK/kit" DPTRAIN_CHECK_BUILD_DIR="$WORK/$name/build" DPTRAIN_CHECK_GPU=1 \
    DPTRAIN_CHECK_BUDGET=300 DPTRAIN_CHECK_SCALE=0.5 "$@" \
    bash "$CHECK" >"$WORK/$name/stdout" 2>"$WORK/$name/stderr"
  echo $? >"$WORK/$name/status"
}

expect() {  # expect SCENARIO WHAT COMMAND...: one line, and a miss counted
  local name=$1 what=$2
  shift 2
  EXPECTED=$((EXPECTED + 1))
  if "$@"; then
    echo "ok   $name: $what"
  else
    echo "MISS $name: $what"
    MISSES=$((MISSES + 1))
  fi
}
has() { grep -qE -- "$2" "$WORK/$1/out/summary.md"; }    # has SCENARIO PATTERN
lacks() { ! has "$@"; }
status_is() { [ "$(cat "$WORK/$1/status")" = "$2" ]; }
row() { has "$1" "^\| $2 \| $3"; }                       # row SCENARIO STEP VERDICT-PREFIX
log_has() {  # log_has SCENARIO STEP PATTERN; grep reads all, or tar's SIGPIPE fails the pipe
  tar -xzOf "$WORK/$1/out/logs.tar.gz" "./$2.log" | grep -E -- "$3" >/dev/null
}
no_configure_with() { ! grep -v '^--build' "$WORK/$1/state/cmake.calls" | grep -q -- "$2"; }

# The steps in the order of value that the plan must keep.
VALUE_ORDER="preflight build book-bf16 graph-bf16 peer-tuned-bf16 build-cuda-tests test-graph"
VALUE_ORDER+=" syncbn-on syncbn-off nccl-one cuda-tests book-fp32 peer-tuned-fp32 faults test-stuck"
VALUE_ORDER+=" peer-book"
steps_in_summary() {  # the step column of SCENARIO's table, space-separated
  sed -n '/^| step | result/,/^$/p' "$WORK/$1/out/summary.md" |
    awk -F' [|] ' 'NR > 2 && NF > 1 { sub(/^[|] /, ""); print $1 }' | paste -sd' '
}

# ---- Scenarios, side by side --------------------------------------------------------------------

# Everything passes: every target met, exit 0. The NCCL variables are set here and must not
# reach the tests; the stuck test must run alone (the stub aborts otherwise).
run_check good TORCH_NCCL_ASYNC_ERROR_HANDLING=3 NCCL_ASYNC_ERROR_HANDLING=1 CUDA_VISIBLE_DEVICES=0 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NVIDIA_TF32_OVERRIDE=1 \
  CUBLAS_WORKSPACE_CONFIG=:4096:8 &
# The graph's capture code does not compile; the error names no NCCL (though the compile command
# does): no build without NCCL, the graph-less build is used. Hazardous variables are flagged.
run_check nograph FAKE_BUILD_NEEDS=-DDPTRAIN_CUDA_GRAPH=OFF \
  FAKE_BUILD_ERROR="lib/src/train/cuda_graph_step.cpp:120:5: error: 'class at::cuda::CUDAGraph' has no member named 'capture_begin' (stub)" \
  TORCH_NCCL_BLOCKING_WAIT=1 NVIDIA_TF32_OVERRIDE=0 &
# nccl.h is missing until DPTRAIN_NCCL=OFF; no CudaGraph test exists yet; the peer is fast; the
# CUDA tests crash; the capture fails with the benchmark off too.
run_check nccl FAKE_BUILD_NEEDS=-DDPTRAIN_NCCL=OFF \
  FAKE_BUILD_ERROR="/venv/torch/include/torch/csrc/distributed/c10d/NCCLUtils.hpp:16:10: fatal error: nccl.h: No such file or directory" \
  FAKE_NO_GRAPH_TESTS=1 FAKE_PEER_PACE=0.3 FAKE_CRASH=1 FAKE_CAPTURE_FAILS=always &
# A test file does not compile; the capture fails only with cuDNN's benchmark on; the records
# are an older dptrain's, without the per-step times.
run_check testfail FAKE_TESTS_FAIL=1 FAKE_CAPTURE_FAILS=benchmark FAKE_OLD_RECORDS=1 &
# The configure cannot find the toolkit until its root is named: the retry with hints is used.
# Blocking wait off as c10d reads it: the new name's "False" over the old name's "1".
run_check hints FAKE_CONFIGURE_NEEDS=-DCUDAToolkit_ROOT= TORCH_NCCL_BLOCKING_WAIT=False \
  NCCL_BLOCKING_WAIT=1 &
# Too little time: 22 s to spend after the 15 s reserve, caps at a fifth, and the graph run and
# every test run hang until their caps or the budget end them, so that the steps from some test
# run on, and peer-book at the latest, are skipped, which is not a pass.
# NCCL_BLOCKING_WAIT=maybe: no value c10d reads, flagged.
run_check time DPTRAIN_CHECK_BUDGET=37 DPTRAIN_CHECK_SCALE=0.2 FAKE_GRAPH_SLEEP=60 FAKE_TESTS_SLEEP=60 \
  NCCL_BLOCKING_WAIT=maybe TORCH_NCCL_BLOCKING_WAIT=YES &
# No GPU, no nvidia-smi: stand-ins, N/A targets with the stand-in's values, cuda-graph refused.
run_check cpu PATH="$FAKE/nosmi:/usr/bin:/bin" DPTRAIN_CHECK_GPU=0 &
# No kit: one clear line and a failure.
run_check nokit DPTRAIN_KIT="$WORK/no-kit" &
# The driver's build lingers past its cap after the link, and the test binary is still
# compiling at its own: the driver is used, the test steps say why they cannot run.
run_check slowbuild DPTRAIN_CHECK_SCALE=0.1 FAKE_APP_LINGER=60 FAKE_TESTS_BUILD_SLEEP=60 &
# book-fp32 stalls after 8 of its 10 epochs until its cap: partial figures, no accuracy verdict.
run_check partial DPTRAIN_CHECK_SCALE=0.2 FAKE_STALL_AFTER=8 &
# Every timer sample dropped (a step that waits on the host): the count, short spins.
run_check drops FAKE_TIMER_DROPS=1 &
# No budget at all: one line, nothing run.
mkdir -p "$WORK/nobudget"
env -u DPTRAIN_CHECK_BUDGET -u DPTRAIN_CHECK_LOAN_LEFT OUT="$WORK/nobudget/out" bash "$CHECK" \
  >"$WORK/nobudget/stdout" 2>"$WORK/nobudget/stderr"
echo $? >"$WORK/nobudget/status"
# SIGTERM while book-bf16 runs: summary.md and logs.tar.gz still come back, and the step's
# processes are gone.
run_check term FAKE_EPOCH_SLEEP=5 &
term_runner=$!
for _ in $(seq 1 300); do
  [ -s "$WORK/term/state/dptrain.pids" ] && break
  sleep 0.1
done
sleep 1
kill -TERM "$(pgrep -f -n "bash $CHECK" -P "$term_runner")"
# The plan alone, for a 15- and a 7-minute loan: printed, nothing run.
mkdir -p "$WORK/plan"
for left in 900 420; do
  DPTRAIN_CHECK_LOAN_LEFT=$left DPTRAIN_CHECK_PRINT_PLAN=1 OUT="$WORK/plan/out" bash "$CHECK" \
    >"$WORK/plan/tsv.$left"
  echo $? >"$WORK/plan/status.$left"
  DPTRAIN_CHECK_LOAN_LEFT=$left DPTRAIN_CHECK_PRINT_PLAN=markdown bash "$CHECK" >"$WORK/plan/markdown.$left"
done
wait

# ---- Expectations -------------------------------------------------------------------------------

rows() { grep -v '^#' "$WORK/plan/tsv.$1"; }  # rows LEFT: the plan's rows, tab-separated
expect plan "exit status 0, nothing else done" \
  bash -c "[ \"\$(cat '$WORK/plan/status.900')\" = 0 ] && [ ! -e '$WORK/plan/out' ]"
# shellcheck disable=SC2016  # awk's fields
expect plan "every row: name, cap, estimate, cumulative cap, fits, source" \
  bash -c "grep -v '^#' '$WORK/plan/tsv.900' | awk -F'\t' 'NF != 6 || \$2 !~ /^[0-9]+\$/ || \$4 !~ /^[0-9]+\$/ || \$3 == \"\" || \$6 == \"\" { exit 1 }'"
expect plan "15 minutes: a budget of 585 s (timeout_s 600 less 15), 539 s for the rows" \
  grep -q '^# budget: 585 s (a loan with 900 s left, .*timeout_s=600, less 15 s before it); 46 s outside the rows; 539 s for the rows$' "$WORK/plan/tsv.900"
# shellcheck disable=SC2016  # awk's fields
expect plan "15 minutes: every row fits, the caps sum to at most the rows' seconds" \
  bash -c "grep -v '^#' '$WORK/plan/tsv.900' | awk -F'\t' '{ s += \$2; if (\$5 != \"yes\") exit 1 } END { exit !(NR > 0 && s <= 539) }'"
expect plan "the seconds outside the rows listed" \
  bash -c "[ \$(grep -c '^# outside the rows: ' '$WORK/plan/tsv.900') = 4 ]"
expect plan "7 minutes: a budget of 255 s, 214 s for the rows" \
  grep -q '^# budget: 255 s (a loan with 420 s left, .*timeout_s=270, .*; 214 s for the rows$' "$WORK/plan/tsv.420"
expect plan "7 minutes: the pre-flight and the build fit, book-bf16 only on seconds left over" \
  bash -c "grep -qP '^build\t180\t[^\t]*\t195\tyes\t' '$WORK/plan/tsv.420' && grep -qP '^book-bf16\t30\t[^\t]*\t225\tno: ' '$WORK/plan/tsv.420'"
expect plan "in the order of value" test "$(rows 900 | cut -f1 | paste -sd' ')" = "$VALUE_ORDER"
expect plan "docs/gpu-check.md holds the plan printed for a 15-minute loan" \
  bash -c "sed -n '/^<!-- DPTRAIN_CHECK_LOAN_LEFT=900 DPTRAIN_CHECK_PRINT_PLAN=markdown -->\$/,/^<!-- end of the plan -->\$/p' docs/gpu-check.md | sed '1d;\$d' | diff -q - '$WORK/plan/markdown.900'"
expect nobudget "no budget: exit 2, one error line, nothing written" \
  bash -c "[ \"\$(cat '$WORK/nobudget/status')\" = 2 ] && grep -q '^error: no budget: set DPTRAIN_CHECK_LOAN_LEFT' '$WORK/nobudget/stderr' && [ ! -e '$WORK/nobudget/out' ]"

expect good "exit status 0" status_is good 0
expect good "two files in \$OUT" test "$(find "$WORK/good/out" -type f | wc -l)" = 2
expect good "steps in order of value" test "$(steps_in_summary good)" = "$VALUE_ORDER"
expect good "accuracy judged on the mean of the last three epochs, with the last and the spreads" has good \
  '^- \[PASS\] dptrain fp32 test accuracy \(target >= 0.93; judged: mean of epochs 8-10\): 0.9350 \(epoch 10: 0.9360; spread of epochs 8-10: 0.9290-0.9400; peer tuned fp32, epochs 3-5: 0.9100-0.9300\)$'
expect good "fp32 s/epoch line" has good '^- \[PASS\] dptrain fp32 s/epoch, median of epochs 2-10 \(target <= 1.0\): 0.900 s$'
expect good "bf16 s/epoch line" has good '^- \[PASS\] dptrain bf16 s/epoch, median of epochs 2-10 \(target <= 0.45\): 0.400 s$'
expect good "images/s against the tuned peer, fp32" has good '^- \[PASS\] dptrain fp32 images/s against peer tuned fp32.*: 2.22x'
expect good "images/s against the tuned peer, bf16 graph" has good '^- \[PASS\] dptrain bf16 --cuda-graph images/s against peer tuned bf16.*: 2.50x'
expect good "sync-bn line with its bound" has good '^- \[PASS\] sync-bn .*relative difference <= 0.0039\): 0.812345 against 0.812400, relative 6.8e-05'
expect good "a skipped test is no crash" lacks good '^ended inside: '
expect good "all ten checks passed" has good '^checks passed: 10 of 10$'
expect good "GPU/wall: GPU-bound" has good '^\| dptrain fp32 \| 3.83 \| 3.64 \| 0.95 \| 0 dropped, spin 3.0 ms/epoch \| GPU-bound \|$'
expect good "GPU/wall: host-bound, by how much" has good '^\| dptrain bf16 \| 1.70 \| 0.85 \| 0.50 \| 0 dropped, spin 3.0 ms/epoch \| host-bound: wall is 2.0x the GPU time \|$'
expect good "GPU/wall: partly host-bound" has good '^\| dptrain bf16 --cuda-graph \| 1.70 \| 1.28 \| 0.75 \| 0 dropped, spin 3.0 ms/epoch \| partly host-bound \|$'
expect good "nvidia-smi summarised, idle samples dropped" has good '^\| dptrain fp32 \| [0-9]+ \| 97 \| 1980 \| 456 \| GPU \|$'
expect good "environment logged: NCCL" has good '^TORCH_NCCL_ASYNC_ERROR_HANDLING=3$'
expect good "environment logged: the allocator" has good '^PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True$'
expect good "environment logged: TF32 and cuBLAS" \
  bash -c "grep -q '^NVIDIA_TF32_OVERRIDE=1$' '$WORK/good/out/summary.md' && grep -q '^CUBLAS_WORKSPACE_CONFIG=:4096:8$' '$WORK/good/out/summary.md'"
expect good "no hazard flagged" lacks good '^hazard: '
expect good "the CUDA tests built as their own step" row good build-cuda-tests 'ok \|'
expect good "the driver built alone, then the tests, keeping going" \
  bash -c "grep -E -- '^--build ' '$WORK/good/state/cmake.calls' | sed -E 's/^--build [^ ]+ -j [0-9]+ //' | paste -sd'|' | grep -qx -- '--target dptrain_app|--target dptrain_cuda_tests -- -k 0'"
expect good "the summary written at the start and at exit only (a short run)" \
  has good 'the summary written 2 times\.$'
expect good "the timer's count on the run's last line" has good '^test acc: 0.9360, .*; GPU timer: 0 of 30 samples dropped$'

expect good "tests ran without the NCCL variables" row good cuda-tests 'ok'
expect good "stuck test alone, passed" row good test-stuck 'ok'
expect good "the graph step with LibTorch's C++ stack" log_has good graph-bf16 '^\(stub\) TORCH_SHOW_CPP_STACKTRACES=1$'
expect good "only the graph step" bash -c "! tar -xzOf '$WORK/good/out/logs.tar.gz' ./book-bf16.log | grep -q STACKTRACES"
expect good "no capture rerun" lacks good '^\| graph-rerun '
expect good "the tuned peer's 5 epochs" log_has good peer-tuned-bf16 '"epochs": 5,'
expect good "epoch lines kept" has good '^epoch 10/10: train loss'
expect good "progress lines left out" lacks good '^epoch [0-9]+/[0-9]+ step'
expect good "build used: the default" has good '^Build used: the default\.$'

expect nograph "exit status 1" status_is nograph 1
expect nograph "first build failed, retried" row nograph build 'failed \(exit 1\); retried \*\*\(not passed'
expect nograph "a compile error: no retry with toolkit hints" \
  bash -c "! grep -q '^| build-hints ' '$WORK/nograph/out/summary.md'"
expect nograph "no build without NCCL: the errors name none" \
  bash -c "! grep -q '^| build-no-nccl ' '$WORK/nograph/out/summary.md' && ! grep -v '^--build' '$WORK/nograph/state/cmake.calls' | grep -q DPTRAIN_NCCL=OFF"
expect nograph "graph-less build used" row nograph build-no-graph 'ok'
expect nograph "the summary names it" has nograph '^Build used: the retry without the CUDA graph \(-DDPTRAIN_CUDA_GRAPH=OFF\)'
expect nograph "graph-bf16 skipped, not passed" row nograph graph-bf16 'skipped: built without the CUDA graph \(-DDPTRAIN_CUDA_GRAPH=OFF\) \*\*\(not passed'
expect nograph "test-graph skipped, not passed" row nograph test-graph 'skipped: built without the CUDA graph \(-DDPTRAIN_CUDA_GRAPH=OFF\) \*\*\(not passed'
expect nograph "book runs ran" bash -c "grep -qE '^\| book-bf16 \| ok' '$WORK/nograph/out/summary.md' && grep -qE '^\| book-fp32 \| ok' '$WORK/nograph/out/summary.md'"
expect nograph "the CUDA tests ran" row nograph cuda-tests 'ok'
expect nograph "TORCH_NCCL_BLOCKING_WAIT flagged" has nograph '^hazard: TORCH_NCCL_BLOCKING_WAIT=1: dptrain refuses --cuda-graph over NCCL'
expect nograph "NVIDIA_TF32_OVERRIDE=0 flagged" has nograph '^hazard: NVIDIA_TF32_OVERRIDE=0: '

expect nccl "exit status 1" status_is nccl 1
expect nccl "a compile error: no retry with toolkit hints" \
  bash -c "! grep -q '^| build-hints ' '$WORK/nccl/out/summary.md'"
expect nccl "build without NCCL used" row nccl build-no-nccl 'ok'
expect nccl "no graph-less attempt" bash -c "! grep -q '^| build-no-graph ' '$WORK/nccl/out/summary.md'"
expect nccl "the summary names the build" has nccl '^Build used: the retry without NCCL, CUDA only \(-DDPTRAIN_NCCL=OFF\)'
expect nccl "book runs still ran" row nccl book-bf16 'ok'
expect nccl "a filter matching no test fails" row nccl test-graph 'failed \(exit 1\)'
expect nccl "a crash names the test it ended" has nccl '^ended inside: CudaReplicas.TwoOnOneGpuOverGlooStayBitIdentical$'
expect nccl "the tests after a crash still run" row nccl test-stuck 'ok'
expect nccl "a missed ratio is FAIL with its value" has nccl '^- \[FAIL\] dptrain bf16 images/s against peer tuned bf16.*: 0.75x'
expect nccl "capture failed: rerun" row nccl graph-rerun 'failed \(exit 1\)'
expect nccl "the summary says the benchmark is not the cause" has nccl "^- \[NOTE\] .*could not be captured; capture fails with the benchmark off too"

expect hints "a failed configure: retried with toolkit hints" row hints build 'failed \(exit 1\); retried'
expect hints "the hints build used" has hints '^Build used: the retry with toolkit hints \(-DCUDAToolkit_ROOT=[^ ]*'
expect hints "no retry without NCCL or the graph" \
  bash -c "! grep -qE '^\| build-no-(nccl|graph) ' '$WORK/hints/out/summary.md'"
expect hints "book runs ran" row hints book-bf16 'ok'
expect hints "blocking wait off as c10d reads it: no hazard" lacks hints '^hazard: '
expect time "a blocking-wait value c10d refuses is flagged" has time \
  '^hazard: NCCL_BLOCKING_WAIT=maybe: not a value c10d reads'
expect time "the new name's YES is on" has time '^hazard: TORCH_NCCL_BLOCKING_WAIT=YES: dptrain refuses --cuda-graph'


expect testfail "exit status 1" status_is testfail 1
expect testfail "build ok" row testfail build 'ok \|'
expect testfail "the CUDA tests' row: failed, not passed" \
  row testfail build-cuda-tests 'failed \(exit 1\) \*\*\(not passed'
expect testfail "the test steps skipped, saying why" bash -c "for s in test-graph cuda-tests faults test-stuck; do
  grep -qE \"^\\| \$s \\| skipped: dptrain_cuda_tests was not built \\(build-cuda-tests: failed \\(exit 1\\)\\)\" '$WORK/testfail/out/summary.md' || exit 1; done"
expect testfail "book runs still ran" bash -c "grep -qE '^\| book-bf16 \| ok' '$WORK/testfail/out/summary.md' && grep -qE '^\| book-fp32 \| ok' '$WORK/testfail/out/summary.md'"
expect testfail "no retry for a test file" bash -c "! grep -q '^| build-hints ' '$WORK/testfail/out/summary.md'"
expect testfail "capture failed" row testfail graph-bf16 'failed \(exit 1\)'
expect testfail "rerun with the benchmark off, 2 epochs" \
  log_has testfail graph-rerun '^\(stub\) dptrain train .*--epochs 2 --cudnn-benchmark off .*--cuda-graph$'
expect testfail "rerun passed" row testfail graph-rerun 'ok'
expect testfail "the summary says the benchmark is the cause" has testfail "^- \[NOTE\] .*could not be captured; capture fails only with cuDNN's benchmark on"
expect testfail "old records still parse" has testfail '^- \[PASS\] dptrain fp32 test accuracy .*: 0.9350 '
expect testfail "GPU/wall without the fields: not measured" \
  has testfail '^\| dptrain fp32 \| - \| - \| - \| - \| not measured: the records have no gpu_ms_per_step'

expect time "exit status 1" status_is time 1
expect time "a step skipped for time" has time '^\| [a-z0-9-]+ \| skipped: out of time .*\*\*\(not passed\)\*\*'
expect time "book-bf16 still ran first" row time book-bf16 'ok'
expect time "the graph run timed out" row time graph-bf16 'timed out after'
expect time "peer-book skipped for time" row time peer-book 'skipped: out of time'
expect time "an unmeasured target says why" has time '^- \[NOT MEASURED\] .*: not measured \([a-z0-9-]+: (skipped: out of time|timed out)'

expect term "exit status 143" status_is term 143
expect term "the killed step's row" row term book-bf16 'killed by SIGTERM after [0-9]+ s \*\*\(not passed'
expect term "the summary says so" has term '^\*\*Stopped by SIGTERM\*\*'
expect term "the steps after it: not reached" row term peer-book 'not reached'
expect term "the log of the killed step is in logs.tar.gz" \
  bash -c "tar -tzf '$WORK/term/out/logs.tar.gz' | grep -q '^./book-bf16.log$'"
expect term "no part-written file left" test ! -e "$WORK/term/out/.summary.md.part"
expect term "the stub dptrain was ended" \
  bash -c "! kill -0 \$(tail -n 1 '$WORK/term/state/dptrain.pids') 2>/dev/null"

expect cpu "exit status 0 (only the sync-bn check counts)" status_is cpu 0
expect cpu "targets N/A with values, judged on the epochs there are" has cpu \
  '^- \[N/A, no GPU\] dptrain fp32 test accuracy \(target >= 0.93; judged: mean of epochs 1-2, all the 2 the run has\): 0.9380 \(epoch 2: 0.9360; spread of epochs 1-2: 0.9360-0.9400; peer tuned fp32, epochs 1-2: 0.8900-0.9000\) \(CPU stand-in\)$'
expect cpu "sync-bn counted on the CPU" has cpu '^checks passed: 1 of 1$'
expect cpu "cuda-graph refused on the CPU, then run without" row cpu graph-bf16 'ok'
expect cpu "GPU/wall: not measured on the CPU" has cpu '^\| dptrain fp32 \| [0-9.]+ \| - \| - \| - \| not measured: no CUDA events on the CPU \|$'
expect cpu "not sampled without nvidia-smi" has cpu '^not sampled: no nvidia-smi here$'

expect nokit "exit status 1" status_is nokit 1
expect nokit "the summary says the kit is missing" row nokit build 'skipped: no device kit'

expect slowbuild "the driver's build timed out" row slowbuild build 'timed out after 18 s \*\*\(not passed'
expect slowbuild "no retry after a timed-out build" bash -c "! grep -qE '^\| build-(hints|no-nccl|no-graph) ' '$WORK/slowbuild/out/summary.md'"
expect slowbuild "the linked driver is used" has slowbuild '^Build used: the default \(build: timed out after 18 s, but .*/app/dptrain was linked\)\.$'
expect slowbuild "the book runs ran on it" bash -c "grep -qE '^\| book-bf16 \| ok' '$WORK/slowbuild/out/summary.md' && grep -qE '^\| book-fp32 \| ok' '$WORK/slowbuild/out/summary.md'"
expect slowbuild "the test binary timed out at its own cap" row slowbuild build-cuda-tests 'timed out after 5 s'
expect slowbuild "the test steps say why they cannot run" row slowbuild test-graph 'skipped: dptrain_cuda_tests was not built \(build-cuda-tests: timed out after 5 s\)'
expect slowbuild "the dptrain rows after it still ran" bash -c "grep -qE '^\| syncbn-on \| ok' '$WORK/slowbuild/out/summary.md' && grep -qE '^\| nccl-one \| ok' '$WORK/slowbuild/out/summary.md'"

expect partial "book-fp32 cut by its cap" row partial book-fp32 'timed out after 9 s'
expect partial "no accuracy verdict on 8 of 10 epochs, saying why" has partial \
  '^- \[NOT MEASURED\] dptrain fp32 test accuracy .*: not measured \(book-fp32: timed out after 9 s, 8 of 10 epochs; accuracy is judged on a complete run only\)$'
expect partial "s/epoch on the 8 epochs, marked partial" has partial \
  '^- \[PASS\] dptrain fp32 s/epoch, median of epochs 2-8 \(target <= 1.0\): 0.900 s \(partial: 8 of 10 epochs; book-fp32: timed out after 9 s\)$'
expect partial "images/s on the 8 epochs, marked partial" has partial \
  '^- \[PASS\] dptrain fp32 images/s against peer tuned fp32, same call \(target >= 2x\): 2.22x \(66667 against 30000 images/s\) \(partial: 8 of 10 epochs; book-fp32: timed out after 9 s\)$'
expect partial "the complete runs judged in full" has partial '^- \[PASS\] dptrain bf16 test accuracy .*: 0.9350 '
expect partial "exit status 1 (a step not passed)" status_is partial 1

expect drops "GPU time not measured: every sample dropped, counted" has drops \
  '^\| dptrain fp32 \| 3.83 \| - \| - \| 27 dropped, spin 0.0 ms/epoch \| not measured: every sampled step dropped'
expect drops "the count on the run's last line" log_has drops book-fp32 '^test acc: .*; GPU timer: 30 of 30 samples dropped$'
expect drops "the summary shows the run's last line" has drops '^test acc: .*; GPU timer: 30 of 30 samples dropped$'
# shellcheck disable=SC2016  # awk's fields
expect drops "no 100 ms spins: 6 ms in epoch 1, none after" bash -c \
  "tar -xzOf '$WORK/drops/out/logs.tar.gz' ./book-fp32.jsonl | grep -oE '\"gpu_spin_ms\":[0-9.]+' | cut -d: -f2 | paste -sd' ' | grep -qx '6.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0'"

if [ -n "${DPTRAIN_SELFTEST_KEEP:-}" ]; then
  rm -rf "$DPTRAIN_SELFTEST_KEEP" && cp -r "$WORK" "$DPTRAIN_SELFTEST_KEEP"
fi
if [ "$MISSES" -gt 0 ]; then
  echo "gpu_check_selftest: $MISSES of $EXPECTED expectations missed; outputs kept in ${WORK}.kept"
  cp -r "$WORK" "${WORK}.kept"
  exit 1
fi
echo "gpu_check_selftest: all $EXPECTED expectations met"
