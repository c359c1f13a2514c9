#!/usr/bin/env bash
# Two hosts on this machine: two network namespaces joined by a veth pair, each with its own
# address and host name, and torchrun (c10d rendezvous) in each starting 2 dptrain ranks: four
# ranks over Gloo on TCP, bound to the veth. Scenarios (all by default):
#   same       the 4-rank result equals four in-process replicas bit for bit;
#   partition  host B's link goes down mid-epoch: every rank ends within --timeout with one
#              error line, and the newest checkpoint still reads whole;
#   kill-a     SIGKILL of one worker on host A mid-epoch under --max_restarts 2: torchrun restarts
#              the group, which resumes from the newest checkpoint and ends bit-identical to an
#              uninterrupted run;
#   kill-b     the same for a worker on host B.
# Needs root (namespaces), iproute2, util-linux and a Python with torch.distributed.run. Exits
# 77, CTest's skip, where this machine cannot make namespaces. Everything it creates (the
# namespaces, their veth, /etc/netns/NAME) is removed on every exit path.
#
#   bash scripts/two-hosts.sh --dptrain build/app/dptrain --python /usr/bin/python3 [SCENARIO...]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dptrain=$here/../build/app/dptrain
python=/usr/bin/python3
data_dir=${DPTRAIN_DATA:-/usr/share/datasets/fashion-mnist}
work=
scenarios=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dptrain) dptrain=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    same|partition|kill-a|kill-b) scenarios+=("$1"); shift ;;
    *) echo "error: two-hosts.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ ${#scenarios[@]} -gt 0 ] || scenarios=(same partition kill-a kill-b)
# The physical path: ranks_in compares it with /proc/PID/exe, which has no symbolic links.
dptrain=$(cd "$(dirname "$dptrain")" && pwd -P)/$(basename "$dptrain")

skip() { echo "two-hosts: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip (iproute2)"
command -v unshare >/dev/null || skip "no unshare (util-linux)"
"$python" -c "import torch.distributed.run" 2>/dev/null || skip "$python has no torch.distributed.run"
[ -r "$data_dir/train-images-idx3-ubyte.gz" ] || skip "no Fashion-MNIST in $data_dir"

# ---- The two hosts --------------------------------------------------------------------------

id=$$
ns_a=dpt-a-$id ns_b=dpt-b-$id
veth_a=dpta$((id % 100000)) veth_b=dptb$((id % 100000))   # interface names: 15 bytes at most
subnet=10.213.$((id % 250))
addr_a=$subnet.1 addr_b=$subnet.2
host_a=dpt-host-a host_b=dpt-host-b
made_work=0
if [ -z "$work" ]; then work=$(mktemp -d "${TMPDIR:-/tmp}/dptrain-two-hosts.XXXXXX"); made_work=1; fi
mkdir -p "$work"

cleanup() {
  local status=$?
  for ns in "$ns_a" "$ns_b"; do
    # Whatever still runs in a namespace (a torchrun agent, a rank) goes with it.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  [ "$made_work" = 1 ] && [ "$status" = 0 ] && rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns_a" 2>/dev/null || skip "this machine cannot make network namespaces"
ip netns add "$ns_b"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  # `ip netns exec` mounts /etc/netns/NAME/hosts over /etc/hosts: each host resolves both names.
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$addr_a" "$host_a" "$addr_b" "$host_b" \
    > "/etc/netns/$ns/hosts"
done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
echo "two-hosts: $host_a = $addr_a in $ns_a ($veth_a), $host_b = $addr_b in $ns_b ($veth_b)"

# ---- Running dptrain ------------------------------------------------------------------------

# The run every scenario trains: 32 steps an epoch, 2 epochs, a step checkpoint every 4 steps.
train_flags=(--width 8 --epochs 2 --batch-size 64 --train-limit 2048 --test-limit 512 --seed 5
             --threads 1 --data-dir "$data_dir" --checkpoint-every-steps 4 --resume)

# torchrun on host A or B: 2 ranks of `dptrain train` with the flags given, logs under $1/logs-X.
# Underscored flags and explicit --redirects: Debian's torchrun 1.13 under Python 3.11 knows
# only those and misreads its own defaults (see tests/train/test_train.cpp).
torchrun_on() {
  local host=$1 dir=$2 restarts=$3 port=$4; shift 4
  local ns veth name
  if [ "$host" = a ]; then ns=$ns_a veth=$veth_a name=$host_a; else ns=$ns_b veth=$veth_b name=$host_b; fi
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" \
    env GLOO_SOCKET_IFNAME="$veth" OMP_NUM_THREADS=1 \
    "$python" -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \
    --rdzv_endpoint="$host_a:$port" --rdzv_id="dpt$id" --max_restarts="$restarts" \
    --monitor_interval=1 --log_dir="$dir/logs-$host" --redirects=0:2,1:2 --tee=0:2,1:2 --no_python \
    "$dptrain" train "$@" >"$dir/torchrun-$host.out" 2>"$dir/torchrun-$host.err"
}

# The dptrain ranks (not the agents) running in namespace $1.
ranks_in() { ip netns pids "$1" | while read -r pid; do
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$dptrain" ] && echo "$pid"; done; true; }

# The newest global step among the checkpoints in $1; fails, naming it, if any does not read.
# Without the tensors as torch tensors: importing a CUDA torch takes seconds on a loaded machine,
# in which a short run passes the step the partition waits for and ends.
newest_step() {
  "$python" - "$1" "$here" <<'PY'
import glob, os, sys
sys.path.insert(0, sys.argv[2])
from read_checkpoint import CheckpointError, read_checkpoint
steps = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "checkpoint-*.safetensors"))):
    try:
        steps.append(read_checkpoint(path, load_tensors=False)["global_step"])
    except (CheckpointError, OSError) as e:
        sys.exit(f"error: {e}")
if not steps:
    sys.exit(f"error: no checkpoint in {sys.argv[1]}")
print(max(steps))
PY
}

# Waits until $1 holds a checkpoint at global step $2 or later; fails after $3 seconds.
wait_for_step() {
  local dir=$1 step=$2 deadline=$(( $(date +%s) + $3 )) newest
  while [ "$(date +%s)" -lt "$deadline" ]; do
    newest=$(newest_step "$dir" 2>/dev/null) && [ "$newest" -ge "$step" ] && return 0
    sleep 0.05
  done
  echo "error: two-hosts: no checkpoint at step $step in $dir after $3 s" >&2
  return 1
}

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }

# The reference: the same run as four replicas in one process, uninterrupted.
reference() {
  local dir=$work/reference
  [ -f "$dir/model.safetensors" ] && return 0
  mkdir -p "$dir"
  "$dptrain" train --devices cpu,cpu,cpu,cpu "${train_flags[@]}" --threads 4 \
    --checkpoint-dir "$dir/checkpoints" --save-model "$dir/model.safetensors" >"$dir/out" 2>"$dir/err"
  echo "reference (4 replicas in one process): $(tail -n 1 "$dir/out")"
}

# A 4-rank run over both hosts; $2 restarts allowed. Starts it in the background (pids in
# agent_a, agent_b).
start_two_hosts() {
  local dir=$1 restarts=$2; shift 2
  mkdir -p "$dir"
  local port; port=$(free_port)
  torchrun_on a "$dir" "$restarts" "$port" "${train_flags[@]}" --checkpoint-dir "$dir/checkpoints" \
    --save-model "$dir/model.safetensors" "$@" &
  agent_a=$!
  torchrun_on b "$dir" "$restarts" "$port" "${train_flags[@]}" --checkpoint-dir "$dir/checkpoints" \
    --save-model "$dir/model.safetensors" "$@" &
  agent_b=$!
}

# compare_models.py exits 0 for bit-identical models, 1 for models that differ (its max line
# says by how much) and 2 where it could not compare them (its error line says why).
compare_with_reference() {
  local status=0
  "$python" "$here/compare_models.py" --buffers "$work/reference/model.safetensors" \
    "$1/model.safetensors" || status=$?
  case "$status" in
    0) ;;
    1) echo "error: two-hosts: the model of $1 is not bit-identical to the reference" >&2 ;;
    *) echo "error: two-hosts: the model of $1 could not be compared with the reference" \
         "(compare_models.py exit $status)" >&2 ;;
  esac
  return "$status"
}

# ---- The scenarios --------------------------------------------------------------------------

scenario_same() {
  local dir=$work/same
  reference
  start_two_hosts "$dir" 0
  wait "$agent_a" && wait "$agent_b" || { echo "error: two-hosts: the 4-rank run failed; logs in $dir" >&2; return 1; }
  echo "same: $(tail -n 1 "$dir/torchrun-a.out" "$dir/torchrun-b.out" | grep 'test acc' | sed 's/^\[[^]]*\]://')"
  compare_with_reference "$dir"
}

scenario_partition() {
  local dir=$work/partition timeout=10
  start_two_hosts "$dir" 0 --timeout "$timeout"
  wait_for_step "$dir/checkpoints" 8 120 || return 1
  # The ranks to watch: two a host. Finding none would make "every rank is gone" true at once.
  local watched_a watched_b
  watched_a=$(ranks_in "$ns_a" | wc -l) watched_b=$(ranks_in "$ns_b" | wc -l)
  if [ "$watched_a" != 2 ] || [ "$watched_b" != 2 ]; then
    echo "error: two-hosts: found $watched_a rank(s) of $dptrain on $host_a and $watched_b on" \
      "$host_b before the partition, expected 2 on each" >&2
    return 1
  fi
  ip -n "$ns_b" link set "$veth_b" down
  local cut; cut=$(date +%s.%N)
  echo "partition: $host_b's link down at step >= 8"
  # Every rank must be gone within the timeout (and the few seconds of diagnosis after it).
  local deadline=$(( $(date +%s) + timeout + 20 )) ended=()
  while [ -n "$(ranks_in "$ns_a")$(ranks_in "$ns_b")" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "error: two-hosts: ranks still running $((timeout + 20)) s after the partition:" \
        "$(ranks_in "$ns_a") $(ranks_in "$ns_b")" >&2
      return 1
    fi
    sleep 0.1
  done
  local seconds; seconds=$(awk -v a="$(date +%s.%N)" -v b="$cut" 'BEGIN { printf "%.1f", a - b }')
  echo "partition: every rank ended ${seconds} s after the link went down (--timeout $timeout)"
  kill "$agent_a" "$agent_b" 2>/dev/null || true
  wait "$agent_a" "$agent_b" 2>/dev/null || true
  ip -n "$ns_b" link set "$veth_b" up  # the next scenario's hosts are joined again
  # One error line from each rank, naming what it could not reach: four logs, none missing.
  local failed=0 logs=0
  for log in $(find "$dir" -path '*attempt_0/*/stderr.log' | sort); do
    local errors; errors=$(grep -c '^error:' "$log" || true)
    echo "  $(echo "$log" | sed "s|$dir/||"): $(grep '^error:' "$log" | head -n 1)"
    [ "$errors" = 1 ] || { echo "error: two-hosts: $log holds $errors error lines, not 1" >&2; failed=1; }
    # Host A's ranks name host B's ranks; host B's, cut off from the store, name host A.
    local lost="did not answer (on $host_b)"
    case "$log" in "$dir/logs-b/"*) lost="the rendezvous store (on $host_a)" ;; esac
    grep '^error:' "$log" | grep -F "$lost" >/dev/null ||
      { echo "error: two-hosts: $log does not say \"$lost\"" >&2; failed=1; }
    logs=$((logs + 1))
  done
  if [ "$logs" != 4 ]; then
    echo "error: two-hosts: $logs rank log(s) (attempt_0/*/stderr.log) under $dir, expected 4" >&2
    failed=1
  fi
  local newest
  if newest=$(newest_step "$dir/checkpoints"); then
    echo "partition: every checkpoint reads whole; the newest is at global step $newest"
  else
    echo "error: two-hosts: a checkpoint in $dir/checkpoints does not read" >&2; failed=1
  fi
  return "$failed"
}

scenario_kill() {
  local host=$1 dir=$work/kill-$1 ns
  [ "$host" = a ] && ns=$ns_a || ns=$ns_b
  reference
  start_two_hosts "$dir" 2
  wait_for_step "$dir/checkpoints" 6 120 || return 1
  local victim; victim=$(ranks_in "$ns" | head -n 1)
  [ -n "$victim" ] || { echo "error: two-hosts: no rank of host $host to kill" >&2; return 1; }
  local rank; rank=$(tr '\0' '\n' < "/proc/$victim/environ" | sed -n 's/^RANK=//p')
  kill -9 "$victim"
  echo "kill-$host: SIGKILL to rank $rank (pid $victim) on host $host after a checkpoint at step >= 6"
  wait "$agent_a" && wait "$agent_b" || { echo "error: two-hosts: the elastic run failed; logs in $dir" >&2; return 1; }
  local attempts; attempts=$(find "$dir/logs-a" -maxdepth 2 -type d -name 'attempt_*' | wc -l)
  echo "kill-$host: torchrun ran $attempts attempt(s) ($((attempts - 1)) restart(s));" \
    "$(grep -h 'resuming from' "$dir"/torchrun-*.out | sed 's|^\[[^]]*\]:||' | sort -u | tr '\n' ' ')"
  [ "$attempts" -ge 2 ] || { echo "error: two-hosts: no restart happened" >&2; return 1; }
  compare_with_reference "$dir"
}

status=0
for s in "${scenarios[@]}"; do
  echo "== $s"
  case "$s" in
    same) scenario_same || status=1 ;;
    partition) scenario_partition || status=1 ;;
    kill-a) scenario_kill a || status=1 ;;
    kill-b) scenario_kill b || status=1 ;;
  esac
done
[ "$status" = 0 ] && echo "two-hosts: every scenario passed" || echo "two-hosts: FAILED; files in $work"
exit "$status"
