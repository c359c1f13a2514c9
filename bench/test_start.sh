#!/usr/bin/env bash
# What starting one test costs: the same trivial GoogleTest test run as its own process (as
# CTest ran every test before) and handed to the forked test server (Note [Tests forked from a
# loaded binary], tests/support/forked_test_server.cpp), RUNS times each, alternating; medians
# and ranges of wall and user CPU seconds, and the ratio of the medians.
#   bash bench/test_start.sh [BUILD_DIR] [RUNS] [TEST]
# BUILD_DIR defaults to build (scripts/test.sh's), RUNS to 15, TEST to a test that does nothing
# but check a constant.
set -euo pipefail
build=${1:-build}
runs=${2:-15}
test=${3:-CheckpointFormat.FileNamesSortByPosition}
binary=$build/tests/dptrain_tests
client=$build/tests/dptrain_test_client
[ -x "$binary" ] && [ -x "$client" ] || {
  echo "error: test_start.sh: no $binary or $client; build with scripts/test.sh first" >&2
  exit 2
}
command -v /usr/bin/time >/dev/null || { echo "error: test_start.sh: needs /usr/bin/time" >&2; exit 2; }
work=$(mktemp -d)
socket=$work/server.sock
export DPTRAIN_FORKED_TEST_SOCKET=$socket  # a server of its own, beside any CTest's
trap '"$client" --stop "$binary" >/dev/null; rm -rf "$work"' EXIT
# The server lives as long as this script, its watched parent.
"$client" "$binary" --serve-forked-tests | grep -q "forked test server: serving" || {
  echo "error: test_start.sh: the forked test server did not start" >&2
  exit 1
}

# One run: "wall user" seconds, appended to $work/<name>.
timed() {
  local name=$1
  shift
  /usr/bin/time -f "%e %U" -o "$work/one" "$@" >/dev/null 2>&1 || {
    echo "error: test_start.sh: '$*' failed" >&2
    exit 1
  }
  cat "$work/one" >>"$work/$name"
}
timed warm-up "$binary" --gtest_filter="$test"
for ((run = 0; run < runs; run++)); do
  timed alone "$binary" --gtest_filter="$test"
  timed served "$client" "$binary" --gtest_filter="$test"
done

# column 1 (wall) or 2 (user) of a file: "median (min to max)"
summary() { cut -d' ' -f"$2" "$work/$1" | sort -g | awk '{v[NR] = $1} END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%.3f (%.2f to %.2f)", m, v[1], v[NR] }'; }
median() { summary "$1" "$2" | cut -d' ' -f1; }
echo "test_start: $test, $runs runs each, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "%-8s %-24s %-24s\n" "" "wall s, median (range)" "user s, median (range)"
for name in alone served; do
  printf "%-8s %-24s %-24s\n" "$name" "$(summary $name 1)" "$(summary $name 2)"
done
awk -v a="$(median alone 1)" -v s="$(median served 1)" \
  'BEGIN { printf "served/alone, wall medians: %.3f\n", s / a }'
