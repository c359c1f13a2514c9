#!/usr/bin/env bash
# Tests bench/gpu_check.sh's own logic without a GPU, a build or torch, in seconds: stub programs
# early on $PATH (cmake, nvidia-smi, python3 for the peer only) and stub dptrain and dptrain_tests
# that print dptrain's and GoogleTest's real line formats. Each scenario runs the check into a
# temporary $OUT and greps its summary.md, logs.tar.gz and exit status. Not here: anything about
# the real programs (scripts/rehearse-device.sh runs the real build and steps without a GPU).
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

# ---- Stub programs ------------------------------------------------------------------------------

# cmake: configure fails unless its arguments hold $FAKE_CMAKE_NEEDS; --build installs the stubs.
cat >"$FAKE/bin/cmake" <<'EOF'
#!/usr/bin/env bash
if [ "$1" = --version ]; then echo "cmake version 0.0 (stub)"; exit 0; fi
if [ "$1" = --build ]; then
  target=${*: -1}
  case $target in
    dptrain_app) mkdir -p "$2/app" && cp "$FAKE/dptrain" "$2/app/dptrain" ;;
    dptrain_tests) mkdir -p "$2/tests" && cp "$FAKE/dptrain_tests" "$2/tests/dptrain_tests" ;;
  esac
  echo "[1/1] Linking $target (stub)"
  exit 0
fi
if [ -n "${FAKE_CMAKE_NEEDS:-}" ] && [[ "$*" != *"$FAKE_CMAKE_NEEDS"* ]]; then
  echo "CMake Error at third_party/dependencies.cmake:1 (stub: needs $FAKE_CMAKE_NEEDS)"
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

# python3: the peer prints its --epochs JSON lines; anything else is the real python3.
REAL_PYTHON=$(command -v python3)
cat >"$FAKE/bin/python3" <<EOF
#!/usr/bin/env bash
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
    print(json.dumps({"epoch": e + 1, "seconds": seconds, "test_acc": 0.9,
                      "images_per_second": 60000 / seconds}))
print(json.dumps({"epochs": epochs, "steady_seconds": seconds}))
EOF

# dptrain train: progress lines on stderr, epoch lines on stdout, --metrics records, the median
# and final lines; --cuda-graph on cpu is a usage error (exit 2) as dptrain's check_world has it.
cat >"$FAKE/dptrain" <<'EOF'
#!/usr/bin/env bash
echo $$ >>"$FAKE_STATE/dptrain.pids"
epochs=10 metrics="" amp=off graph=0 sync=0 cpu=0
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=$2; shift ;;
    --metrics) metrics=$2; shift ;;
    --amp) amp=$2; shift ;;
    --cuda-graph) graph=1 ;;
    --sync-bn) sync=1 ;;
    --devices) [ "$2" = cpu ] && cpu=1; shift ;;
  esac
  shift
done
if [ "$graph" = 1 ] && [ "$cpu" = 1 ]; then
  echo "error: --cuda-graph needs one CUDA device per process; got cpu" >&2
  exit 2
fi
steady=$([ "$amp" = bf16 ] && echo 0.40 || echo 0.90)
loss=$([ "$sync" = 1 ] && echo 0.812345 || echo 0.812400)
for e in $(seq 1 "$epochs"); do
  sleep "${FAKE_EPOCH_SLEEP:-0}"
  s=$([ "$e" = 1 ] && echo 3.0 || echo "$steady")
  rate=$(awk -v s="$s" 'BEGIN { printf "%.0f", 60000 / s }')
  echo "epoch $e/$epochs step 50/235: loss 9.9999, acc 0.1111, 1234 img/s, 3 s left" >&2
  echo "epoch $e/$epochs: train loss $loss, train acc 0.9000, test acc 0.9351, $s s, $rate img/s"
  [ -z "$metrics" ] || printf '{"epoch":%s,"train_loss":%s,"train_acc":0.9,"test_loss":0.25,%s}\n' \
    "$e" "$loss" "\"test_acc\":0.9351,\"seconds\":$s,\"images_per_second\":$rate,\"devices\":\"cuda:0\"" \
    >>"$metrics"
done
echo "median of epochs 2-$epochs: $steady sec/epoch (epoch 1: 3 s)"
echo "test acc: 0.94, 1.0 sec/epoch on [cuda:0]"
EOF

# dptrain_tests: GoogleTest's lines. It fails when it sees the NCCL error-handling variables,
# aborts as LibTorch would when the stuck-collective test runs beside others (and in the CUDA
# tests when FAKE_CRASH is set), and matches no CudaGraph test when FAKE_NO_GRAPH_TESTS is set.
cat >"$FAKE/dptrain_tests" <<'EOF'
#!/usr/bin/env bash
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
    DPTRAIN_CHECK_BUDGET=300 DPTRAIN_CHECK_SCALE=0.2 "$@" \
    bash "$CHECK" >"$WORK/$name/stdout" 2>"$WORK/$name/stderr"
  echo $? >"$WORK/$name/status"
}

expect() {  # expect SCENARIO WHAT COMMAND...: one line, and a miss counted
  local name=$1 what=$2
  shift 2
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

# ---- Scenarios ----------------------------------------------------------------------------------

# Everything passes: every target met, exit 0. The NCCL variables are set here and must not
# reach the tests; the stuck test must run alone (the stub aborts otherwise).
run_check good TORCH_NCCL_ASYNC_ERROR_HANDLING=3 NCCL_ASYNC_ERROR_HANDLING=1 CUDA_VISIBLE_DEVICES=0
expect good "exit status 0" status_is good 0
expect good "two files in \$OUT" test "$(find "$WORK/good/out" -type f | wc -l)" = 2
ORDER="build book-fp32 book-bf16 peer-tuned-fp32 peer-tuned-bf16 graph-bf16 build-tests test-graph"
ORDER+=" cuda-tests nccl-one syncbn-on syncbn-off faults test-stuck peer-book"
expect good "steps in order of value" test "$(sed -n '/^| step | result/,/^$/p' "$WORK/good/out/summary.md" |
  awk -F' [|] ' 'NR > 2 && NF > 1 { sub(/^[|] /, ""); print $1 }' | paste -sd' ')" = "$ORDER"
expect good "accuracy line with its value" has good '^- \[PASS\] dptrain fp32 test accuracy after 10 epochs \(target >= 0.93\): 0.9351$'
expect good "fp32 s/epoch line" has good '^- \[PASS\] dptrain fp32 s/epoch, median of epochs 2-10 \(target <= 1.0\): 0.900 s$'
expect good "bf16 s/epoch line" has good '^- \[PASS\] dptrain bf16 s/epoch, median of epochs 2-10 \(target <= 0.45\): 0.400 s$'
expect good "images/s against the tuned peer, fp32" has good '^- \[PASS\] dptrain fp32 images/s against peer tuned fp32.*: 2.22x'
expect good "images/s against the tuned peer, bf16 graph" has good '^- \[PASS\] dptrain bf16 --cuda-graph images/s against peer tuned bf16.*: 2.50x'
expect good "sync-bn line with its bound" has good '^- \[PASS\] sync-bn .*relative difference <= 0.0039\): 0.812345 against 0.812400, relative 6.8e-05'
expect good "a skipped test is no crash" lacks good '^ended inside: '
expect good "all ten checks passed" has good '^checks passed: 10 of 10$'
expect good "nvidia-smi summarised, idle samples dropped" has good '^\| dptrain fp32 \| [0-9]+ \| 97 \| 1980 \| 456 \| GPU \|$'
expect good "environment logged" has good '^TORCH_NCCL_ASYNC_ERROR_HANDLING=3$'
expect good "tests ran without the NCCL variables" row good cuda-tests 'ok'
expect good "stuck test alone, passed" row good test-stuck 'ok'
expect good "epoch lines kept" has good '^epoch 10/10: train loss'
expect good "progress lines left out" lacks good '^epoch [0-9]+/[0-9]+ step'
expect good "build used: the default" has good '^Build used: the default\.$'
expect good "the old pattern would have taken the progress lines" \
  bash -c "tar -xzOf '$WORK/good/out/logs.tar.gz' ./book-fp32.log | grep -E '^epoch [0-9]+/' | grep -q ' step '"

# The build fails until DPTRAIN_NCCL=OFF; no CudaGraph test exists yet; the peer is fast; the
# CUDA tests crash.
run_check retry FAKE_CMAKE_NEEDS=-DDPTRAIN_NCCL=OFF FAKE_NO_GRAPH_TESTS=1 FAKE_PEER_PACE=0.3 FAKE_CRASH=1
expect retry "exit status 1" status_is retry 1
expect retry "first build failed, retried" row retry build 'failed \(exit 1\); retried \*\*\(not passed\)'
expect retry "hinted build failed, retried" row retry build-hints 'failed \(exit 1\); retried'
expect retry "build without NCCL used" row retry build-no-nccl 'ok'
expect retry "the summary names the build" has retry '^Build used: the retry without NCCL, CUDA only \(-DCUDAToolkit_ROOT=.* -DDPTRAIN_NCCL=OFF\)'
expect retry "book runs still ran" row retry book-fp32 'ok'
expect retry "a filter matching no test fails" row retry test-graph 'failed \(exit 1\)'
expect retry "a crash names the test it ended" has retry '^ended inside: CudaReplicas.TwoOnOneGpuOverGlooStayBitIdentical$'
expect retry "the tests after a crash still run" row retry test-stuck 'ok'
expect retry "a missed ratio is FAIL with its value" has retry '^- \[FAIL\] dptrain bf16 images/s against peer tuned bf16.*: 0.75x'

# Too little time: a slow peer eats the budget (13 s to spend after the 15 s reserve, the peer's
# cap 9 s), so the steps after it are skipped, which is not a pass.
run_check time DPTRAIN_CHECK_BUDGET=28 DPTRAIN_CHECK_SCALE=0.1 FAKE_EPOCH_SLEEP=0.1 FAKE_PEER_SLEEP=60
expect time "exit status 1" status_is time 1
expect time "a step skipped for time" has time '^\| [a-z0-9-]+ \| skipped: out of time .*\*\*\(not passed\)\*\*'
expect time "book-fp32 still ran first" row time book-fp32 'ok'
expect time "an unmeasured target says why" has time '^- \[NOT MEASURED\] .*: not measured \([a-z0-9-]+: skipped: out of time'

# SIGTERM while book-fp32 runs: summary.md and logs.tar.gz still come back, and the step's
# processes are gone.
mkdir -p "$WORK/term/state"
run_check term FAKE_EPOCH_SLEEP=5 &
runner=$!
for _ in $(seq 1 100); do
  grep -q 'running book-fp32' "$WORK/term/out/summary.md" 2>/dev/null && break
  sleep 0.1
done
sleep 1
check_pid=$(pgrep -f -n "bash $CHECK" -P "$runner")
kill -TERM "$check_pid"
wait "$runner"
expect term "exit status 143" status_is term 143
expect term "the killed step's row" row term book-fp32 'killed by SIGTERM after [0-9]+ s \*\*\(not passed\)'
expect term "the summary says so" has term '^\*\*Stopped by SIGTERM\*\*'
expect term "the steps after it: not reached" row term peer-book 'not reached'
expect term "the log of the killed step is in logs.tar.gz" \
  bash -c "tar -tzf '$WORK/term/out/logs.tar.gz' | grep -q '^./book-fp32.log$'"
expect term "no part-written file left" test ! -e "$WORK/term/out/.summary.md.part"
expect term "the stub dptrain was ended" \
  bash -c "! kill -0 \$(tail -n 1 '$WORK/term/state/dptrain.pids') 2>/dev/null"

# No GPU, no nvidia-smi: stand-ins, N/A targets with the stand-in's values, cuda-graph refused.
run_check cpu PATH="$FAKE/nosmi:/usr/bin:/bin" DPTRAIN_CHECK_GPU=0
expect cpu "exit status 0 (only the sync-bn check counts)" status_is cpu 0
expect cpu "targets N/A with values" has cpu '^- \[N/A, no GPU\] dptrain fp32 test accuracy after 2 epochs \(target >= 0.93\): 0.9351 \(CPU stand-in\)$'
expect cpu "sync-bn counted on the CPU" has cpu '^checks passed: 1 of 1$'
expect cpu "cuda-graph refused on the CPU, then run without" row cpu graph-bf16 'ok'
expect cpu "not sampled without nvidia-smi" has cpu '^not sampled: no nvidia-smi here$'

# No kit: one clear line and a failure.
run_check nokit DPTRAIN_KIT="$WORK/no-kit"
expect nokit "exit status 1" status_is nokit 1
expect nokit "the summary says the kit is missing" row nokit build 'skipped: no device kit'

if [ -n "${DPTRAIN_SELFTEST_KEEP:-}" ]; then
  rm -rf "$DPTRAIN_SELFTEST_KEEP" && cp -r "$WORK" "$DPTRAIN_SELFTEST_KEEP"
fi
if [ "$MISSES" -gt 0 ]; then
  echo "gpu_check_selftest: $MISSES expectation(s) missed; outputs kept in ${WORK}.kept"
  cp -r "$WORK" "${WORK}.kept"
  exit 1
fi
echo "gpu_check_selftest: all expectations met"
