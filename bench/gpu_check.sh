#!/usr/bin/env bash
# The one command for the GPU machine (a rare loan): builds dptrain against the image's PyTorch
# with only the device kit (scripts/device-kit.sh, carried as .device-kit), then the CUDA test
# binary as a step of its own, and runs the steps of PLAN_ROWS below, most valuable first, each
# under its own cap (seconds, times DPTRAIN_CHECK_SCALE), all within a budget taken from the
# loan's time left (DPTRAIN_CHECK_LOAN_LEFT, status's budget_left_s). A step starts only with a
# third of its cap left; otherwise it is "skipped: out of time". At the start, at most once a
# minute between steps, and on any exit (a trap on EXIT, TERM and INT), it writes summary.md
# (one pass/fail line per target, bench/gpu_summary.py) and logs.tar.gz (every log, per-epoch
# record and nvidia-smi sample so far) to $OUT: two files, so a call killed at the tool's limit
# still returns what ran. It prints the summary last. A binary that exists is used whatever its
# build step's verdict. Exit status: 0 when every step passed and every target was met, 1 when a
# step did not pass (failed, timed out, skipped or never reached), 2 when only targets were
# missed or the budget is missing; 130 or 143 when interrupted. Without a GPU
# (scripts/rehearse-device.sh) each CUDA step runs its CPU stand-in and the GPU targets are N/A.
# docs/gpu-check.md explains the plan, the budget, the retries and the summary.
#
#   device tool: status -> budget_left_s = L; then
#     run(command="DPTRAIN_CHECK_LOAN_LEFT=L bash bench/gpu_check.sh", carry=[".device-kit"],
#         timeout_s=min(600, L - 150))
#   DPTRAIN_CHECK_LOAN_LEFT=900 DPTRAIN_CHECK_PRINT_PLAN=1 bash bench/gpu_check.sh  # the plan, tab-separated
#   DPTRAIN_CHECK_LOAN_LEFT=900 DPTRAIN_CHECK_PRINT_PLAN=markdown bash bench/gpu_check.sh  # docs' table
#
# Environment: DPTRAIN_CHECK_LOAN_LEFT (the loan's seconds left) or DPTRAIN_CHECK_BUDGET (the
# command's own seconds, for the rehearsal and the self-test), DPTRAIN_CHECK_SCALE (multiplies
# every cap, may be a fraction: 2 shared cores need ~15), DPTRAIN_CHECK_JOBS,
# DPTRAIN_CHECK_BUILD_DIR, DPTRAIN_KIT, DPTRAIN_CHECK_SUMMARY_EVERY (seconds between summaries,
# 60), and DPTRAIN_CHECK_GPU=auto|0|1 (bench/gpu_check_selftest.sh forces it with stub programs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# ---- The plan -----------------------------------------------------------------------------------
# One row per step, in order of value: name | cap (s) | estimate on the GPU machine (s, 16 cores,
# one H100 or H200) | where the estimate comes from. No estimate is measured on a GPU yet; the
# first loan's summary.md replaces them (bench/results/). For a fresh 15-minute loan the caps and
# the seconds outside the rows (print_plan) fit the budget, so that a healthy machine reaches the
# last step; a shorter loan runs the rows that fit and those that the earlier rows' unused
# seconds let start.
PLAN_ROWS=(
  "preflight|15|4-8|one python3 that imports torch once (CUDA, versions, cmake prefix path), nvidia-smi, nvcc and cmake --version (torch 2.11's import with CUDA: 2-5 s)"
  "build|180|100-180|dptrain_app alone: 54 of the ~60 LibTorch translation units of the 110-200 s estimate on 16 vCPUs (issue 55), the links and the configure's CUDA and NCCL probes"
  "book-bf16|30|11-18|the book's 10 epochs at 0.45-1 s/epoch (issue 24's bf16 target to the design estimate) + ~6 s CUDA/cuDNN start"
  "graph-bf16|30|12-20|book-bf16 plus the capture in epoch 1 (design estimate)"
  "peer-tuned-bf16|18|8-14|5 epochs at 0.5-1.5 s/epoch + ~5 s torch import and CUDA start (design estimate); right after the graph run, so that the bf16 speed-up verdict survives a cut tail"
  "build-cuda-tests|50|25-45|dptrain_cuda_tests beside the driver's objects: its five test files (the longest 32-34 s at -O3 on this machine), GoogleTest, the test support and one link"
  "test-graph|20|8-14|~6 s CUDA start + 7 tests of small captured steps at ~1 s (design estimate)"
  "syncbn-on|10|6-9|one bf16 step of batch 256 + ~6 s CUDA and NCCL start (design estimate)"
  "syncbn-off|10|6-9|as syncbn-on"
  "nccl-one|30|11-28|2 fp32 epochs of the full data, cuDNN's benchmark on, + ~6 s CUDA and NCCL start (issue 55, from the work per epoch)"
  "cuda-tests|25|12-22|~6 s CUDA start + the 12 GPU tests of three files at 0.2-1 s, each NCCL group ~1 s (design estimate)"
  "book-fp32|45|21-44|the book's 10 epochs at 1.5-3.8 s/epoch (issue 55, from the work per epoch) + ~6 s CUDA/cuDNN start"
  "peer-tuned-fp32|18|9-15|5 epochs at 0.8-1.8 s/epoch + ~5 s torch import and CUDA start (design estimate)"
  "faults|18|10-17|two ranks' CUDA start (~6 s) per test; the Gloo survivor ends within the 3 s diagnosis after the kill; the NCCL kill test skips on one GPU"
  "test-stuck|10|6-9|~4 s CUDA and NCCL start + the 3 s kernel that the 1 s timeout aborts behind (tests/integration/test_cuda.cpp)"
  "peer-book|10|7-10|2 epochs of the book's code at 1-2 s/epoch + ~5 s torch import and CUDA start (design estimate)"
)
LOAN_OVERHEAD=150   # seconds of a loan outside the command: the machine's start (a minute or
                    # more), the tree's and the kit's transfer, the files' return, the give-back
TOOL_LIMIT=600      # the device tool's most seconds per command
TOOL_MARGIN=15      # the check ends this long before the call's timeout_s
KILL_GRACE=10       # a timed-out step's --kill-after
LAST_SUMMARY=5      # the summary and tarball written at exit
GRAPH_RERUN_CAP=20  # the capture's rerun without cuDNN's benchmark, held back until graph-bf16 passes
RETRY_FLOOR=60      # a build retry's least cap: a reconfigure, the failed files and the links
SUMMARY_EVERY=${DPTRAIN_CHECK_SUMMARY_EVERY:-60}  # seconds between summaries
SUMMARY_COST=1      # seconds one summary and tarball take (python3, tar; measured well below)
PLAN=() ESTIMATE=() SOURCE=()
declare -A CAP=()
for row in "${PLAN_ROWS[@]}"; do
  IFS='|' read -r name cap estimate source <<<"$row"
  PLAN+=("$name") CAP[$name]=$cap ESTIMATE+=("$estimate") SOURCE+=("$source")
done
unset row name cap estimate source

# The budget: the loan's seconds left less what the loan spends outside the command, within the
# tool's limit, less a margin before the call's timeout_s; or DPTRAIN_CHECK_BUDGET as given.
TIMEOUT_S=""
if [ -n "${DPTRAIN_CHECK_BUDGET:-}" ]; then
  BUDGET=$DPTRAIN_CHECK_BUDGET
elif [ -n "${DPTRAIN_CHECK_LOAN_LEFT:-}" ]; then
  case $DPTRAIN_CHECK_LOAN_LEFT in
    *[!0-9]* | "") echo "error: DPTRAIN_CHECK_LOAN_LEFT=$DPTRAIN_CHECK_LOAN_LEFT: expected whole seconds (status's budget_left_s)" >&2
      exit 2 ;;
  esac
  TIMEOUT_S=$((DPTRAIN_CHECK_LOAN_LEFT - LOAN_OVERHEAD))
  [ "$TIMEOUT_S" -le "$TOOL_LIMIT" ] || TIMEOUT_S=$TOOL_LIMIT
  BUDGET=$((TIMEOUT_S - TOOL_MARGIN))
else
  echo "error: no budget: set DPTRAIN_CHECK_LOAN_LEFT to the loan's seconds left (the device tool's status, budget_left_s) and run with timeout_s=min(600, that - $LOAN_OVERHEAD) (docs/gpu-check.md)" >&2
  exit 2
fi
case $BUDGET in
  "" | *[!0-9]* | 0) echo "error: a budget of '$BUDGET' s leaves nothing to run (DPTRAIN_CHECK_BUDGET: whole seconds; DPTRAIN_CHECK_LOAN_LEFT: more than $((LOAN_OVERHEAD + TOOL_MARGIN)))" >&2
    exit 2 ;;
esac
SCALE=${DPTRAIN_CHECK_SCALE:-1}
scaled() { awk -v c="$1" -v s="$SCALE" 'BEGIN { printf "%d", c * s + 0.5 }'; }

# Seconds outside the rows, all counted: the first, the once-a-minute and the last summary, a
# timed-out step's grace, and the capture's rerun, held back until graph-bf16 passes.
if [ "$SUMMARY_EVERY" -gt 0 ]; then
  SUMMARIES=$((BUDGET / SUMMARY_EVERY + 2))
else
  SUMMARIES=$((${#PLAN[@]} + 2))
fi
GRAPH_RERUN=$(scaled "$GRAPH_RERUN_CAP")
RESERVE=$((KILL_GRACE + LAST_SUMMARY))  # kept back to the end; GRAPH_HELD beside it until then
OUTSIDE=$((RESERVE + GRAPH_RERUN + SUMMARIES * SUMMARY_COST))

# print_plan 1|markdown: the budget, every row's cap (scaled), estimate, cumulative cap and whether
# it fits what the budget leaves for the rows, and the seconds outside the rows; tab-separated
# (lines of the budget and the outside seconds start with "#"), or docs/gpu-check.md's block.
print_plan() {
  local i name cap cumulative=0 rows=$((BUDGET - OUTSIDE)) fits
  local budget_line="budget: $BUDGET s"
  [ -z "$TIMEOUT_S" ] || budget_line+=" (a loan with $DPTRAIN_CHECK_LOAN_LEFT s left, less $LOAN_OVERHEAD s for the machine's start, the transfers and the give-back: timeout_s=$TIMEOUT_S, less $TOOL_MARGIN s before it)"
  budget_line+="; $OUTSIDE s outside the rows; $rows s for the rows"
  local outside=(
    "reserve: $KILL_GRACE s for a timed-out step's grace (--kill-after) + $LAST_SUMMARY s for the summary at exit"
    "capture rerun: $GRAPH_RERUN s, held back until graph-bf16 is done (then, unless its capture failed, given to the rows after it)"
    "summaries: $SUMMARIES at most (at the start, once a minute, at exit) at ~$SUMMARY_COST s"
    "not reserved: a failed build's retries (at least $(scaled "$RETRY_FLOOR") s each, up to three) take their seconds from the last rows"
  )
  if [ "$1" = markdown ]; then
    echo "Plan for ${budget_line#budget: }."
    echo
    echo "| step | cap (s) | estimate (s) | cumulative cap (s) | fits | where the estimate comes from |"
    echo "|---|---|---|---|---|---|"
  else
    echo "# $budget_line"
  fi
  for i in "${!PLAN[@]}"; do
    name=${PLAN[$i]}
    cap=$(scaled "${CAP[$name]}")
    cumulative=$((cumulative + cap))
    fits=yes
    [ "$cumulative" -le "$rows" ] || fits="no: on seconds the rows before leave"
    if [ "$1" = markdown ]; then
      printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$cap" "${ESTIMATE[$i]}" "$cumulative" \
        "$fits" "${SOURCE[$i]}"
    else
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$cap" "${ESTIMATE[$i]}" "$cumulative" "$fits" \
        "${SOURCE[$i]}"
    fi
  done
  [ "$1" != markdown ] || echo
  for i in "${outside[@]}"; do
    if [ "$1" = markdown ]; then echo "- $i"; else echo "# outside the rows: $i"; fi
  done
}
if [ -n "${DPTRAIN_CHECK_PRINT_PLAN:-}" ]; then
  print_plan "$DPTRAIN_CHECK_PRINT_PLAN"
  exit 0
fi

OUT=${OUT:-$PWD/gpu-check-out}
KIT=$(realpath -m "${DPTRAIN_KIT:-.device-kit}")
JOBS=${DPTRAIN_CHECK_JOBS:-$(nproc)}
BUILD=${DPTRAIN_CHECK_BUILD_DIR:-build-gpu-check}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
BEGIN=$SECONDS
DATA=$KIT/data/fashion-mnist
DPTRAIN=$BUILD/app/dptrain
TESTS=$BUILD/tests/dptrain_cuda_tests
export DPTRAIN_DATA=$DATA PYTHONUNBUFFERED=1
export BUILD JOBS KIT DPTRAIN TESTS LOGS

# ---- Step bookkeeping ---------------------------------------------------------------------------
# Every step, run or not, ends as one row: its verdict, seconds and whether it passed. The rows
# live in the associative arrays below and in $LOGS/steps.tsv (gpu_summary.py reads that).
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

GRAPH_HELD=$GRAPH_RERUN  # the capture rerun's seconds, held back until graph-bf16 is done
seconds_left() { echo $((BUDGET - RESERVE - GRAPH_HELD - (SECONDS - BEGIN))); }

# step NAME CAP COMMAND...: runs COMMAND (a program or an exported function, which finds the
# step's name in $STEP_NAME) under min(CAP * SCALE, time left) (run_step: CAP already scaled), logging to $LOGS/NAME.log,
# sampling the GPU if NAME is in $SAMPLED, and records its row. With less than a third of its
# cap left a step does not start: the time goes to the shorter steps after it, and its row says
# "skipped: out of time", which counts as not passed. The command runs in the background so
# that a TERM reaches the trap at once (bash defers traps while a foreground child runs).
# Returns the command's status (99 when skipped).
step() { run_step "$1" "$(scaled "$2")" "${@:3}"; }

run_step() {
  local name=$1 cap=$2
  shift 2
  local left floor limit
  left=$(seconds_left)
  floor=$((cap / 3 > 1 ? cap / 3 : 1))
  if [ "$left" -lt "$floor" ]; then
    left=$((left > 0 ? left : 0))
    record "$name" "skipped: out of time ($left s left, a third of its $cap s cap needed)" 0 0
    return 99
  fi
  limit=$((cap < left ? cap : left))
  echo "== $name (up to ${limit} s)" >&2
  CURRENT=$name CURRENT_START=$SECONDS
  case $SAMPLED in *" $name "*) start_sampler "$name" ;; esac
  summary_due  # when due: a kill from now on shows this step as the one running
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
  summary_due
  return "$status"
}

planned() { step "$1" "${CAP[$1]}" "${@:2}"; }  # planned NAME COMMAND...: step under the plan's cap

# not_run NAME WHY: a step that cannot run (its build failed): a row, counted as not passed.
not_run() {
  record "$1" "skipped: $2" 0 0
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
    echo "**In progress** ($elapsed s of $BUDGET): running $CURRENT; rewritten at most once a minute."
  elif [ "$FINISHED" = 1 ]; then
    echo "Finished in $elapsed s of a $BUDGET s budget (caps scaled by $SCALE); the summary written $((WRITES + 1)) times."
  else
    echo "**In progress** ($elapsed s of $BUDGET)."
  fi
}

# The rows so far, the step running now (a planned one, a build retry or graph-rerun), then the
# planned steps not reached.
steps_table() {
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  local name mark
  for name in "${ORDER[@]}"; do
    mark=$([ "${PASSED[$name]}" = 1 ] || echo ' **(not passed)**')
    echo "| $name | ${VERDICT[$name]}$mark | ${TOOK[$name]} |"
  done
  if [ -n "$CURRENT" ] && [ -z "${VERDICT[$CURRENT]+set}" ]; then
    echo "| $CURRENT | running for $((SECONDS - CURRENT_START)) s |  |"
  fi
  for name in "${PLAN[@]}"; do
    if [ -n "${VERDICT[$name]+set}" ] || [ "$name" = "$CURRENT" ]; then continue; fi
    echo "| $name | not reached **(not passed)** |  |"
  done
}

# The logs' telling lines: gtest's totals, skips, failures and notes, and the test a crash hit;
# the last two of dptrain's epoch lines ("epoch 3/10: train loss ...", not the progress lines
# "epoch 3/10 step 50/235: ..." on stderr), its median and final lines, and its errors.
log_details() {
  local name log
  for name in build build-hints build-no-nccl build-no-graph; do
    log=$LOGS/$name.log
    [ -f "$log" ] || continue
    echo "$name, found at configure time, and its errors:"
    echo '```'
    grep -E 'dptrain: |Found CUDA|PyTorch: CUDA|Found Torch|Found ZLIB| error|Error|^note: ' "$log" |
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
  for name in book-bf16 graph-bf16 graph-rerun nccl-one syncbn-on syncbn-off book-fp32; do
    log=$LOGS/$name.log
    [ -f "$log" ] || continue
    echo "$name$([ "$GPU" = 1 ] || echo ' (CPU stand-in)'):"
    echo '```'
    grep -E '^epoch [0-9]+/[0-9]+: ' "$log" | tail -n 2
    grep -E '^median of epochs|^GPU time per step|^CUDA graph: |^test acc: |error:|refused' "$log" |
      head -n 8
    echo '```'
  done
}

# summary_due: writes the summary when the last is SUMMARY_EVERY seconds old: each costs ~1 s of
# python3 and tar (more with many logs), counted in the plan; a TERM or INT still writes one at
# once (on_signal), so only a KILL loses the steps since the last.
LAST_WRITTEN=-1
summary_due() {
  if [ "$LAST_WRITTEN" -lt 0 ] || [ $((SECONDS - LAST_WRITTEN)) -ge "$SUMMARY_EVERY" ]; then
    write_summary
  fi
}

# Writes $OUT/summary.md and $OUT/logs.tar.gz whole (a file written aside, then renamed), so
# that whatever ends the call leaves the last complete pair behind.
write_summary() {
  local part=$OUT/.summary.md.part
  local no_gpu=()
  [ "$GPU" = 1 ] || no_gpu=(--no-gpu)
  {
    cat "$LOGS/machine.md" 2>/dev/null || echo "# gpu_check: the pre-flight has not ended yet"
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
  LAST_WRITTEN=$SECONDS
  WRITES=$((WRITES + 1))
}
WRITES=0

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
GPU=${DPTRAIN_CHECK_GPU:-auto}  # resolved by the pre-flight
BOOK_EPOCHS=10
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT
trap on_exit EXIT

# Every variable that changes what CUDA, cuDNN, NCCL, cuBLAS, LibTorch's caching allocator,
# OpenMP or the dynamic loader do: a run's numbers mean little without them. TORCH_ covers
# TORCH_NCCL_*, TORCH_SHOW_CPP_STACKTRACES, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE, TORCH_CUDNN_V8_API_*
# and TORCH_BLAS_PREFER_CUBLASLT; NVIDIA_ covers NVIDIA_TF32_OVERRIDE; PYTORCH_ the allocator's.
LOGGED_VARIABLES='^(NCCL_|TORCH_|CUDA_|CUDNN_|CUBLAS_|CUBLASLT_|NVIDIA_|PYTORCH_|OMP_|LD_PRELOAD=|LD_LIBRARY_PATH=)'

logged_environment() {  # the variables, sorted, a long value (a container's NVIDIA_REQUIRE_CUDA) cut
  env | grep -E "$LOGGED_VARIABLES" | sort |
    awk '{ if (length($0) > 300) print substr($0, 1, 300) "... (" length($0) " characters)"; else print }'
}

# The settings known to break a step or bend its numbers, one line each with what they do here.
environment_hazards() {
  local name value on=""
  # Read as c10d's getCvarBool reads them (torch/csrc/distributed/c10d/Utils.hpp): the old name
  # first, then the new one over it, each lowered; 1/y/yes/t/true is on, 0/n/no/f/false off, and
  # any other value, under either name, makes every NCCL process group refuse to start.
  for name in NCCL_BLOCKING_WAIT TORCH_NCCL_BLOCKING_WAIT; do
    [ -n "${!name+set}" ] || continue
    value=$(printf '%s' "${!name}" | tr '[:upper:]' '[:lower:]')
    case $value in
      0 | n | no | f | false) on="" ;;
      1 | y | yes | t | true) on=$name ;;
      *) on=""
        echo "hazard: $name=${!name}: not a value c10d reads (1/y/yes/t/true, 0/n/no/f/false," \
          "any case): every NCCL process group refuses it, and dptrain with it" ;;
    esac
  done
  if [ -n "$on" ]; then
    echo "hazard: $on=${!on}: dptrain refuses --cuda-graph over NCCL with it (blocking" \
      "wait breaks the capture); graph-bf16 has no process group and is not affected"
  fi
  case ${CUDA_LAUNCH_BLOCKING:-0} in 0) ;; *)
    echo "hazard: CUDA_LAUNCH_BLOCKING=$CUDA_LAUNCH_BLOCKING: every launch waits for its kernel;" \
      "the timings are not the real ones" ;;
  esac
  [ "${NVIDIA_TF32_OVERRIDE-}" != 0 ] ||
    echo "hazard: NVIDIA_TF32_OVERRIDE=0: no TF32 anywhere; the fp32 s/epoch target assumes TF32"
  case ${PYTORCH_NO_CUDA_MEMORY_CACHING:-0} in 0) ;; *)
    echo "hazard: PYTORCH_NO_CUDA_MEMORY_CACHING=$PYTORCH_NO_CUDA_MEMORY_CACHING: every tensor" \
      "is a cudaMalloc and cudaFree; the timings are not the real ones" ;;
  esac
}

# preflight: the machine, once: one python3 that imports torch (whether CUDA is there, the
# versions, the cmake prefix path), into $LOGS/preflight.env for this script to read, then
# $LOGS/machine.md, the summary's head. A step of the plan: its seconds are counted.
preflight() {
  local gpu=$DPTRAIN_CHECK_GPU
  python3 - >"$LOGS/preflight.env" 2>"$LOGS/preflight.python.log" <<'PY'
import shlex
import torch
import torch.utils
cuda = torch.cuda.is_available()
line = " ".join(str(x) for x in (
    "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
    "nccl", torch.cuda.nccl.version() if cuda else "-", "tf32 cudnn", torch.backends.cudnn.allow_tf32))
print("FOUND_CUDA=%d" % cuda)
print("TORCH_CMAKE=" + shlex.quote(torch.utils.cmake_prefix_path))
print("TORCH_LINE=" + shlex.quote(line))
PY
  cat "$LOGS/preflight.python.log"
  # shellcheck disable=SC1091  # written just above
  . "$LOGS/preflight.env"
  if [ "$gpu" = auto ]; then gpu=${FOUND_CUDA:-0}; fi
  echo "GPU=$gpu" >>"$LOGS/preflight.env"
  {
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
    echo
    echo '```'
    if [ "$gpu" = 1 ]; then
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 ||
        echo "no nvidia-smi: the GPU is not sampled"
    else
      echo "no GPU: CUDA steps run their CPU stand-ins; the GPU targets are N/A"
    fi
    echo "${TORCH_LINE:-torch: not importable (see preflight.python.log)}"
    (command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1) || echo "no nvcc on PATH"
    echo "$(cmake --version | head -n 1); ninja $(ninja --version 2>/dev/null || echo missing); $(c++ --version | head -n 1)"
    echo '```'
    echo
    echo "Environment: every NCCL_, TORCH_, CUDA_, CUDNN_, CUBLAS_, CUBLASLT_, NVIDIA_, PYTORCH_ and"
    echo "OMP_ variable, LD_PRELOAD and LD_LIBRARY_PATH, as the check found them. The test binary"
    echo "runs with TORCH_NCCL_ASYNC_ERROR_HANDLING and NCCL_ASYNC_ERROR_HANDLING unset, graph-bf16"
    echo "with TORCH_SHOW_CPP_STACKTRACES=1, and without a GPU every step with OMP_NUM_THREADS=1:"
    echo '```'
    logged_environment
    logged_environment | grep -q . || echo "(none set)"
    echo '```'
    environment_hazards
  } >"$LOGS/machine.md.part" 2>&1
  mv -f "$LOGS/machine.md.part" "$LOGS/machine.md"
  cat "$LOGS/machine.md"
}
export -f preflight logged_environment environment_hazards
export LOGGED_VARIABLES DPTRAIN_CHECK_GPU=$GPU

write_summary  # the first: a kill from now on leaves the plan's rows as "not reached"
planned preflight preflight
# shellcheck disable=SC1091  # the pre-flight's findings; missing when it failed
. "$LOGS/preflight.env" 2>/dev/null
if [ "$GPU" = auto ]; then GPU=${FOUND_CUDA:-0}; fi
[ "$GPU" = 1 ] || BOOK_EPOCHS=2
if [ ! -f "$KIT/MANIFEST" ]; then
  BUILD_USED="none: the device kit is missing at $KIT (run scripts/device-kit.sh and carry .device-kit)"
  not_run build "no device kit at $KIT"
  exit 1
fi

# ---- Build: the image's torch and the kit, nothing else -----------------------------------------
TORCH_CMAKE=${TORCH_CMAKE:-}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GENERATOR=Ninja
command -v ninja >/dev/null || GENERATOR="Unix Makefiles"
export TORCH_CMAKE NVCC GENERATOR

# build_attempt CMAKE_ARGS...: configure from a fresh cache (a failed probe stays cached
# otherwise), keeping the object files that an unchanged command line can reuse, then build
# dptrain alone: the CUDA tests are a step of their own (build_tests), so that a test file still
# compiling at the cap never costs the driver. It passes when dptrain exists; the binaries of an
# earlier call are removed first, so that a stale one cannot pass for this build.
build_attempt() {
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  rm -f "$DPTRAIN" "$TESTS"
  cmake -S . -B "$BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
    -DDPTRAIN_WERROR=OFF -DDPTRAIN_PLOT_RENDER_TEST=OFF -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$KIT/prefix" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$KIT/src/googletest" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DTORCH_CUDA_ARCH_LIST=9.0 "$@" || return
  cmake --build "$BUILD" -j "$JOBS" --target dptrain_app
  local status=$?
  if [ -x "$DPTRAIN" ]; then
    [ "$status" = 0 ] || echo "note: dptrain built; the build exited $status (see the errors above)"
    return 0
  fi
  echo "error: the build ended without $DPTRAIN (exit $status)"
  return $((status == 0 ? 1 : status))
}

# build_tests: dptrain_cuda_tests in the build folder the driver's attempt configured, keeping
# going past a failed file (-k 0 for Ninja, -k for Make). It passes when the binary exists.
build_tests() {
  local keep_going=(-k 0)  # Ninja: no limit on failed jobs
  [ "$GENERATOR" = Ninja ] || keep_going=(-k)
  cmake --build "$BUILD" -j "$JOBS" --target dptrain_cuda_tests -- "${keep_going[@]}"
  local status=$?
  if [ -x "$TESTS" ]; then
    [ "$status" = 0 ] || echo "note: dptrain_cuda_tests built; the build exited $status"
    return 0
  fi
  echo "error: the build ended without $TESTS (exit $status)"
  return $((status == 0 ? 1 : status))
}
export -f build_attempt build_tests

# The folder of nccl.h in PyPI's NVIDIA wheels (the `nvidia` namespace package), if any.
nccl_include_dir() {
  python3 - <<'PY' 2>/dev/null
import glob, os, sys
import nvidia
for root in list(nvidia.__path__):
    found = glob.glob(os.path.join(root, "nccl", "include", "nccl.h")) + \
        sorted(glob.glob(os.path.join(root, "**", "nccl.h"), recursive=True))
    if found:
        print(os.path.dirname(found[0]))
        sys.exit(0)
sys.exit(1)
PY
}

# names_nccl LOG: true when an error line of LOG names NCCL (nccl.h, ProcessGroupNCCL.hpp,
# NCCLUtils.hpp, third_party/nccl.cmake, a file of ours about NCCL): only then can a build
# without NCCL help. "error" must stand as a word, so that a compile command's -Werror=... beside
# the -I of NCCL's wheel does not count.
configure_failed() {  # configure_failed LOG: CMake stopped before anything was compiled
  grep -qE '^CMake Error|Configuring incomplete' "$1"
}

names_nccl() {
  grep -iE '(^|[^[:alnum:]_-])error($|[^[:alnum:]_])' "$1" | grep -qi nccl
}

# build_retry NAME ARGS...: one more attempt, under what is left of the build's cap but at least
# RETRY_FLOOR seconds (a failed attempt usually fails fast, and the object files are kept, so
# that a retry recompiles only what its arguments change). A retry past the build's cap takes
# its time from the last steps, which matter less than any dptrain number.
BUILD_SPENT=0  # seconds the build's attempts took so far
build_retry() {
  local name=$1 left floor
  shift
  left=$(($(scaled "${CAP[build]}") - BUILD_SPENT))
  floor=$(scaled "$RETRY_FLOOR")
  run_step "$name" $((left > floor ? left : floor)) build_attempt "$@"
  local status=$?
  BUILD_SPENT=$((BUILD_SPENT + ${TOOK[$name]:-0}))
  return "$status"
}

retry_after() {  # retry_after NAME: true when NAME failed outright, marking its row as retried
  case ${VERDICT[$1]} in failed*) ;; *) return 1 ;; esac
  record "$1" "${VERDICT[$1]}; retried" "${TOOK[$1]}" 0
}

# A configure or compile failure gets up to three more tries, so that the book runs still
# happen: with the toolkit's and NCCL's places spelled out; then without NCCL (CUDA only), but
# only when the failed attempt's errors name NCCL; last without the CUDA graph's capture code
# (lib/src/train/cuda_graph_step.cpp, the one file that recompiles), keeping the previous
# attempt's arguments. A timed-out or skipped attempt is not retried: the next would not be
# faster. Sets BUILD_USED, and GRAPH_BUILT=0 for the graph-less build.
GRAPH_BUILT=1
NO_GRAPH_WHY="built without the CUDA graph (-DDPTRAIN_CUDA_GRAPH=OFF)"
build_dptrain() {
  BUILD_USED="none: the build failed"
  build_retry build && { BUILD_USED="the default"; return 0; }
  # A driver linked before the cap (a slow tail, a hung probe) is used whatever the verdict.
  if [ -x "$DPTRAIN" ]; then
    BUILD_USED="the default (build: ${VERDICT[build]}, but $DPTRAIN was linked)"
    return 0
  fi
  retry_after build || return 1
  local args=() nccl last=build
  # The toolkit's places only help a configure that could not find them; after a compile error
  # they would change every file's command line and cost a whole rebuild for nothing.
  if configure_failed "$LOGS/build.log"; then
    args=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(realpath -m "$NVCC")")")")
    nccl=$(nccl_include_dir) && args+=("-DDPTRAIN_NCCL_INCLUDE_DIR=$nccl")
    build_retry build-hints "${args[@]}" &&
      { BUILD_USED="the retry with toolkit hints (${args[*]})"; return 0; }
    retry_after build-hints || return 1
    last=build-hints
  else
    echo "note: the configure passed: no retry with toolkit hints" >>"$LOGS/build.log"
  fi
  if names_nccl "$LOGS/$last.log"; then
    args+=(-DDPTRAIN_NCCL=OFF)
    build_retry build-no-nccl "${args[@]}" && {
      BUILD_USED="the retry without NCCL, CUDA only (${args[*]}): the NCCL steps cannot pass"
      return 0
    }
    retry_after build-no-nccl || return 1
  else
    echo "note: no error line names NCCL: no attempt without NCCL" >>"$LOGS/$last.log"
  fi
  args+=(-DDPTRAIN_CUDA_GRAPH=OFF)
  build_retry build-no-graph "${args[@]}" && {
    GRAPH_BUILT=0
    BUILD_USED="the retry without the CUDA graph (${args[*]}): graph-bf16 and test-graph cannot pass"
    return 0
  }
  return 1
}

# ---- What each step runs: the GPU's, or the CPU stand-in's --------------------------------------
if [ "$GPU" = 1 ]; then
  DEVICES=(--gpus 1)
  PEER=(--device cuda --batch-size 256 --lr 0.1 --width 64)
  PEER_TUNED_EPOCHS=5  # enough for images/s over epochs 2..5; accuracy is dptrain's to show
  PEER_BOOK_EPOCHS=2
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
  PEER_TUNED_EPOCHS=2
  PEER_BOOK_EPOCHS=2
  NCCL_ONE=(--devices cpu --width 8 --memory-format contiguous --backend gloo --epochs 1
    --train-limit 1024 --test-limit 256 --check-replicas 2)
  SYNC=(--devices cpu --width 8 --memory-format contiguous --backend gloo --amp bf16 --epochs 1
    --max-steps 1 --train-limit 1024 --test-limit 256)
  FAULTS='NcclProcesses.*:GlooCudaProcesses.*'  # they skip without a GPU; the filter still matches
fi
BOOK=(--batch-size 256 --lr 0.1 --data-dir "$DATA")  # the book's one-GPU run, less its epochs
PEER+=(--data-dir "$DATA")
PEER_TUNED=(--channels-last --cudnn-benchmark --gpu-data)
STUCK=NcclWorldOfOne.StuckCollectiveEndsInACollectiveErrorWithinTheTimeout
# tests/train/test_cuda_graph.cpp: the parameterised suite is instantiated as Steps/CudaGraph.*, which
# the plain 'CudaGraph.*' does not match (gtest matches the whole name), and the usage checks.
GRAPH_TESTS='*CudaGraph.*:CudaGraphUsage.*'
# The rest of dptrain_cuda_tests' GPU and NCCL tests, and only those: Communicator.* (Gloo over
# threads), NcclEnvironment.*, StepGpuTime's step choice and median, CheckWorld.* and
# CheckPlacements.* are CPU logic that CI runs.
CUDA_TESTS="Cuda*.*:NcclWorldOfOne.*:Reducer.EveryParameterAndGradientIs256ByteAligned"
CUDA_TESTS+=":StepGpuTime.AKernelsTimeIsMeasured:StepGpuTime.TheHostsPaceIsKeptOut"
CUDA_TESTS+=":StepGpuTime.AStepThatWaitsOnTheHostIsDroppedWithoutLongSpins"
CUDA_TESTS+="-$STUCK:$GRAPH_TESTS"  # each runs on its own

# peer ARGS...: the PyTorch peer, its JSON lines kept as the step's records.
peer() {
  python3 bench/pytorch_peer.py "$@" | tee "$LOGS/$STEP_NAME.jsonl"
}

# gtest FILTER: the CUDA test binary without the NCCL error-handling variables, which at 1 or 3
# make LibTorch end the whole process inside the stuck-collective test and lose every later
# test. A filter that matches no test fails: nothing was checked.
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
BUILT=0
build_dptrain && BUILT=1

# The CUDA tests' binary, after the bf16 runs and their peer: used when it exists, whatever the
# step's verdict; otherwise the test steps say why it is missing.
TESTS_MISSING="dptrain_cuda_tests was not built (build-cuda-tests not reached)"
cuda_tests_build() {
  if [ "$BUILT" != 1 ]; then
    not_run build-cuda-tests "no dptrain build"
    TESTS_MISSING="no dptrain build"
    return
  fi
  planned build-cuda-tests build_tests
  [ -x "$TESTS" ] || TESTS_MISSING="dptrain_cuda_tests was not built (build-cuda-tests: ${VERDICT[build-cuda-tests]})"
}

dptrain_step() {  # dptrain_step NAME ARGS...: a dptrain run, when dptrain was built
  if [ "$BUILT" = 1 ]; then
    planned "$1" "$DPTRAIN" train "${@:2}"
  else
    not_run "$1" "no dptrain build"
  fi
}

test_step() {  # test_step NAME FILTER: a run of the CUDA tests, when they were built
  if [ "$BUILT" != 1 ]; then
    not_run "$1" "no dptrain build"
  elif [ ! -x "$TESTS" ]; then
    not_run "$1" "$TESTS_MISSING"
  else
    planned "$1" gtest "$2"
  fi
}

# The bf16 run with --cuda-graph, with LibTorch's C++ stack in any error. Should its capture
# fail, graph-rerun runs it once more, shorter, with cuDNN's benchmark off: cuDNN's benchmark
# runs its trial kernels at a shape's first sight, which a capture cannot hold, so a pass there
# says the capture met a shape that the epochs before had not planned.
capture_failed() {
  grep -qs 'error:.*--cuda-graph: the training step could not be captured' "$LOGS/graph-bf16.log"
}

graph_steps() {
  local args=("${DEVICES[@]}" "${BOOK[@]}" --amp bf16)
  if [ "$BUILT" != 1 ]; then
    not_run graph-bf16 "no dptrain build"
  elif [ "$GRAPH_BUILT" != 1 ]; then
    not_run graph-bf16 "$NO_GRAPH_WHY"
  elif [ "$GPU" != 1 ]; then
    planned graph-bf16 graph_stand_in "${args[@]}" --epochs "$BOOK_EPOCHS" \
      --metrics "$LOGS/graph-bf16.jsonl"
  elif ! planned graph-bf16 env TORCH_SHOW_CPP_STACKTRACES=1 "$DPTRAIN" train "${args[@]}" \
    --epochs "$BOOK_EPOCHS" --metrics "$LOGS/graph-bf16.jsonl" --cuda-graph && capture_failed; then
    GRAPH_HELD=0  # the rerun's held seconds are its own now
    step graph-rerun "$GRAPH_RERUN_CAP" env TORCH_SHOW_CPP_STACKTRACES=1 "$DPTRAIN" train \
      "${args[@]}" --epochs 2 --cudnn-benchmark off --metrics "$LOGS/graph-rerun.jsonl" --cuda-graph
  fi
  GRAPH_HELD=0  # no rerun, or it ran: the rows after it get the seconds
}

dptrain_step book-bf16 "${DEVICES[@]}" "${BOOK[@]}" --epochs "$BOOK_EPOCHS" --amp bf16 \
  --metrics "$LOGS/book-bf16.jsonl"
graph_steps
planned peer-tuned-bf16 peer "${PEER[@]}" "${PEER_TUNED[@]}" --amp bf16 --epochs "$PEER_TUNED_EPOCHS"
cuda_tests_build
if [ "$BUILT" = 1 ] && [ "$GRAPH_BUILT" != 1 ]; then
  not_run test-graph "$NO_GRAPH_WHY"
else
  test_step test-graph "$GRAPH_TESTS"
fi
SYNC+=(--data-dir "$DATA")
dptrain_step syncbn-on "${SYNC[@]}" --sync-bn --metrics "$LOGS/syncbn-on.jsonl"
dptrain_step syncbn-off "${SYNC[@]}" --metrics "$LOGS/syncbn-off.jsonl"
dptrain_step nccl-one "${NCCL_ONE[@]}" --timeout 60 --data-dir "$DATA"
test_step cuda-tests "$CUDA_TESTS"
dptrain_step book-fp32 "${DEVICES[@]}" "${BOOK[@]}" --epochs "$BOOK_EPOCHS" \
  --metrics "$LOGS/book-fp32.jsonl"
planned peer-tuned-fp32 peer "${PEER[@]}" "${PEER_TUNED[@]}" --epochs "$PEER_TUNED_EPOCHS"
test_step faults "$FAULTS"
test_step test-stuck "$STUCK"  # last among the tests: a fatal ending loses nothing after it
planned peer-book peer "${PEER[@]}" --epochs "$PEER_BOOK_EPOCHS"
# on_exit writes the last summary, prints it and sets the exit status.
