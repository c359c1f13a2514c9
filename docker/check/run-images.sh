# shellcheck shell=bash
# Sourced by docker/check.sh: runs one built image the ways users run it, each run one row of
# the table (image, what, pass/fail, the run's result line), and removes what it made.
# Every run is --network none, except the download, which needs the host's loopback mirror.
# Containers are named dptrain-check-*, volumes dptrain-check-*. Not here: the compose
# services (compose-services.sh).

readonly kMirrorSource=/usr/share/datasets/fashion-mnist
# A subset small enough for a few seconds per run on one core.
readonly kSmallTrain=(--devices cpu --width 8 --train-limit 512 --test-limit 256 --epochs 1
                      --batch-size 128 --threads 1)

record_run() { echo "$1|$2|$3|$4" >>"$run_results"; }

# The last non-empty line of a run's output, the one that says how it ended.
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c1-150; }

# run_expect LOG ARGS...: podman run --rm ARGS with its output in LOG; returns its status.
run_expect() {
  local log=$1
  shift
  podman run --rm "$@" >"$log" 2>&1
}

# A loopback HTTP mirror of Fashion-MNIST on the host, for the one run with --network host.
mirror_start() {
  mirror_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  /usr/bin/python3 -m http.server --bind 127.0.0.1 --directory "$kMirrorSource" "$mirror_port" \
    >"$1/mirror.log" 2>&1 &
  mirror_pid=$!
  local tries
  for tries in $(seq 50); do
    curl -sf -o /dev/null "http://127.0.0.1:$mirror_port/" && return 0
    sleep 0.1
  done
  echo "check: the loopback mirror did not start ($tries tries)" >&2
  return 1
}
mirror_stop() { kill "$mirror_pid" 2>/dev/null || true; wait "$mirror_pid" 2>/dev/null || true; }

# ---- The runs ----------------------------------------------------------------------------------
run_image_checks() {
  local work_dir=$1 image=$2
  local tag=${image%%:*}
  local volume=dptrain-check-$tag-data log=$work_dir/run-$tag
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  podman volume create "$volume" >/dev/null
  local data=(--network none -v "$volume:/data")

  if run_expect "$log-help.log" --network none "$image" --help &&
     grep -q '^Usage: dptrain' "$log-help.log"; then
    record_run "$image" "dptrain --help" pass "$(head -n 1 "$log-help.log")"
  else
    record_run "$image" "dptrain --help" fail "$(last_line "$log-help.log")"
  fi

  check_download "$work_dir" "$image" "$volume" "$log-download.log"

  # Debian's files are the real images, recompressed: train reads them, download refuses them
  # (above). They are copied into the volume by the image's own user.
  if run_expect "$log-seed.log" "${data[@]}" -v "$kMirrorSource:/mirror:ro" --entrypoint /bin/sh \
       "$image" -c 'cp /mirror/*.gz /data/fashion-mnist/ && ls /data/fashion-mnist | wc -l'; then
    record_run "$image" "seed the volume as uid 10001" pass "$(last_line "$log-seed.log") files in /data/fashion-mnist"
  else
    record_run "$image" "seed the volume as uid 10001" fail "$(last_line "$log-seed.log")"
  fi

  if run_expect "$log-train.log" "${data[@]}" "$image" train "${kSmallTrain[@]}" &&
     grep -q 'from /data/fashion-mnist' "$log-train.log"; then
    record_run "$image" "train, 1 rank, from the volume" pass "$(last_line "$log-train.log")"
  else
    record_run "$image" "train, 1 rank, from the volume" fail "$(last_line "$log-train.log")"
  fi

  if run_expect "$log-launch.log" "${data[@]}" --entrypoint dptrain-launch "$image" \
       2 train "${kSmallTrain[@]}" && grep -q 'of 2' "$log-launch.log"; then
    record_run "$image" "dptrain-launch 2 (Gloo)" pass "$(last_line "$log-launch.log")"
  else
    record_run "$image" "dptrain-launch 2 (Gloo)" fail "$(last_line "$log-launch.log")"
  fi

  check_stop_checkpoint "$work_dir" "$image" "$volume" "$log-stop"

  local status=0
  run_expect "$log-gpus.log" --network none "$image" train --gpus 1 || status=$?
  if [ "$status" -ne 0 ] && [ "$(grep -c . "$log-gpus.log")" -eq 1 ] &&
     grep -q '^error: ' "$log-gpus.log"; then
    record_run "$image" "train --gpus 1, no GPU (exit $status)" pass "$(last_line "$log-gpus.log")"
  else
    record_run "$image" "train --gpus 1, no GPU (exit $status)" fail "$(last_line "$log-gpus.log")"
  fi

  # The image's user may write its volume and nothing of the image outside /tmp.
  # shellcheck disable=SC2016  # expanded by the container's shell
  run_expect "$log-user.log" "${data[@]}" --entrypoint /bin/sh "$image" -c '
    id -u
    for dir in / /opt/dptrain /opt/dptrain/bin /usr /etc; do
      if touch "$dir/.dptrain-check" 2>/dev/null; then echo "writable: $dir"; fi
    done
    touch /data/.dptrain-check && echo "data writable"' || true
  if [ "$(head -n 1 "$log-user.log")" = 10001 ] && ! grep -q '^writable' "$log-user.log" &&
     grep -q 'data writable' "$log-user.log"; then
    record_run "$image" "user 10001 writes only /data" pass "uid 10001; /, /opt/dptrain, /usr, /etc not writable; /data writable"
  else
    record_run "$image" "user 10001 writes only /data" fail "$(tr '\n' ';' <"$log-user.log")"
  fi

  podman volume rm -f "$volume" >/dev/null
}

# download over the loopback mirror into the volume: the one run on the host's network (its
# loopback only; no bridge, no firewall change). Debian's dataset files are recompressed, so
# their SHA-256 differs from the originals' and dptrain refuses them, in one error line: that
# line is the proof that the container fetched over HTTP and checked what came.
check_download() {
  local work_dir=$1 image=$2 volume=$3 log=$4
  mirror_start "$work_dir"
  local status=0
  run_expect "$log" --network host -v "$volume:/data" "$image" \
    download --data-dir /data/fashion-mnist --url "http://127.0.0.1:$mirror_port/" || status=$?
  mirror_stop
  local what="download from a loopback HTTP mirror"
  if [ "$status" -eq 0 ]; then
    record_run "$image" "$what" pass "$(last_line "$log")"
  elif grep -q 'SHA-256 mismatch' "$log" && grep -q 'GET /' "$work_dir/mirror.log"; then
    record_run "$image" "$what" "pass*" "$(last_line "$log" | cut -c1-110)..."
  else
    record_run "$image" "$what" fail "$(last_line "$log")"
  fi
}

# podman stop (SIGTERM, as docker stop) in the first epoch of a run with --checkpoint-dir: the
# checkpoint it leaves in the volume must be one that dptrain eval and read_checkpoint.py read.
check_stop_checkpoint() {
  local work_dir=$1 image=$2 volume=$3 log=$4
  local name=dptrain-check-stop
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman run -d --name "$name" --network none -v "$volume:/data" "$image" \
    train --devices cpu --width 8 --train-limit 8192 --test-limit 256 --epochs 20 \
    --batch-size 128 --threads 1 --checkpoint-dir /data/checkpoints >/dev/null
  local tries
  for tries in $(seq 120); do
    podman logs "$name" 2>&1 | grep -q 'rank 0 of 1' && break
    sleep 0.5
  done
  sleep 3  # some steps into the first epoch, before its own checkpoint
  podman stop -t 60 "$name" >/dev/null
  local status
  status=$(podman wait "$name" 2>/dev/null || podman inspect --format '{{.State.ExitCode}}' "$name")
  podman logs "$name" >"$log.log" 2>&1
  podman rm -f "$name" >/dev/null
  local checkpoint
  checkpoint=$(podman run --rm --network none -v "$volume:/data" --entrypoint /bin/sh "$image" \
                 -c 'ls /data/checkpoints 2>/dev/null | tail -n 1')
  local what="podman stop in epoch 1 (exit $status): checkpoint"
  if [ -z "$checkpoint" ]; then
    record_run "$image" "$what" fail "no checkpoint in the volume; $(last_line "$log.log")"
    return
  fi
  local mountpoint
  mountpoint=$(podman volume inspect --format '{{.Mountpoint}}' "$volume")
  /usr/bin/python3 scripts/read_checkpoint.py "$mountpoint/checkpoints/$checkpoint" \
    >"$log-read.log" 2>&1 || true
  if run_expect "$log-eval.log" --network none -v "$volume:/data" "$image" eval \
       --checkpoint "/data/checkpoints/$checkpoint" --devices cpu --test-limit 256 --threads 1 &&
     ! grep -q '^error' "$log-read.log"; then
    record_run "$image" "$what" pass "$checkpoint: eval: $(last_line "$log-eval.log")"
  else
    record_run "$image" "$what" fail "$checkpoint: $(last_line "$log-eval.log"); $(last_line "$log-read.log")"
  fi
}

# Nothing of the check's may outlive it: its containers and volumes, by their prefix.
run_cleanup() {
  podman ps -a --format '{{.Names}}' | { grep '^dptrain-check-' || true; } |
    xargs -r podman rm -f >/dev/null
  podman volume ls --format '{{.Name}}' | { grep '^dptrain-check-' || true; } |
    xargs -r podman volume rm -f >/dev/null
}
