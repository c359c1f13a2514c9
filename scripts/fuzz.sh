#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-sanitize, or
# $DPTRAIN_SANITIZE_BUILD_DIR (scripts/configure-sanitized.sh: the build scripts/sanitize.sh
# makes, whose library they reuse), and runs them all at once, each for the given seconds
# (default 60) from its seed corpus in fuzz/corpus/; --build-only builds them alone.
# Crashes land in build-sanitize/crashes/<target>/ and make the script exit non-zero; the corpus
# grown while fuzzing stays in build-sanitize/corpus/, never in the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
build_only=false
[ "$seconds" = --build-only ] && build_only=true
build_dir="${DPTRAIN_SANITIZE_BUILD_DIR:-build-sanitize}"
# clang, libFuzzer with clang's sanitizer runtimes, and llvm-symbolizer for readable stacks.
bash scripts/install-deps.sh clang libclang-rt-14-dev llvm

bash scripts/configure-sanitized.sh "$build_dir"
targets=()
for source in fuzz/fuzz_*.cpp; do targets+=("$(basename "$source" .cpp)"); done
cmake --build "$build_dir" -j "${DPTRAIN_SANITIZE_JOBS:-$(nproc)}" --target "${targets[@]}"
if $build_only; then exit 0; fi

# A leak in a parser fails the run like a crash: libFuzzer runs LeakSanitizer after any input
# whose allocations and frees do not balance.
export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1"
# The targets run at once, each for the given wall seconds: on CI's two cores the three share
# them (two thirds of a core each) and the stage takes one minute instead of three.
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT  # none left running if this script is stopped
for target in "${targets[@]}"; do
  crashes="$build_dir/crashes/$target"
  corpus="$build_dir/corpus/$target"
  mkdir -p "$crashes" "$corpus"
  echo "fuzz: $target for ${seconds}s"
  # -rss_limit_mb: a parser that allocates what a small input does not justify is a bug too.
  # -timeout: seconds one input may take; -max_len: bytes per input (the seeds are smaller).
  # The first corpus directory receives new inputs; the seeds are only read.
  "$build_dir/fuzz/$target" "$corpus" "fuzz/corpus/$target" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
    -artifact_prefix="$crashes/" -print_final_stats=1 >"$build_dir/$target.log" 2>&1 &
  pids+=("$!")
done
failed=()
for k in "${!targets[@]}"; do
  target="${targets[$k]}"
  if ! wait "${pids[$k]}"; then
    failed+=("$target")
    tail -n 60 "$build_dir/$target.log" >&2
  fi
  echo "fuzz: $target:"
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$build_dir/$target.log" || true
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}; the inputs are in $build_dir/crashes/" >&2
  exit 1
fi
echo "fuzz: no crash in ${targets[*]}"
