#!/usr/bin/env bash
# dptrain-launch N ARGS...: starts N dptrain processes on this machine, one rank per GPU, with the
# variables torchrun would give them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT), for the runtime image, which has no Python and so no torchrun. Not a torchrun: no
# restarts, no elastic membership, one machine only. If a rank fails, the others are stopped;
# SIGINT and SIGTERM are passed on to every rank (dptrain then writes a checkpoint if asked to).
set -euo pipefail

if [ "$#" -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: dptrain-launch N dptrain-arguments... (e.g. dptrain-launch 2 train --batch-size 512)" >&2
  exit 2
fi
world_size=$1
shift

export WORLD_SIZE=$world_size
# The ranks share this machine's cores: each takes its share by default, not all of them.
export LOCAL_WORLD_SIZE=$world_size
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-29500}

pids=()
for ((rank = 0; rank < world_size; rank++)); do
  RANK=$rank LOCAL_RANK=$rank "${DPTRAIN:-dptrain}" "$@" &
  pids+=("$!")
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT

# Wait for the ranks one by one; the first failure stops the rest and becomes the exit status.
status=0
remaining=("${pids[@]}")
while [ "${#remaining[@]}" -gt 0 ]; do
  finished=""
  code=0
  wait -n -p finished "${remaining[@]}" || code=$?
  [ -n "${finished:-}" ] || continue  # a signal interrupted the wait; the trap has passed it on
  still=()
  for pid in "${remaining[@]}"; do [ "$pid" = "$finished" ] || still+=("$pid"); done
  remaining=("${still[@]+"${still[@]}"}")
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    echo "dptrain-launch: a rank (pid $finished) exited with status $code; stopping the others" >&2
    [ "${#remaining[@]}" -eq 0 ] || kill -TERM "${remaining[@]}" 2>/dev/null || true
  fi
done
exit "$status"
