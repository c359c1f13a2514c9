# shellcheck shell=bash
# Sourced by docker/check.sh: starts every service of docker/compose.yaml once, on the CPU, with
# docker/compose.cpu.yaml over it, through compose_runs.py and podman run (no compose tool: see
# there why). A row of the table per service. Each training command gets a small subset
# appended, so that a service takes seconds; download gets the loopback file:// mirror.
# Not here: the runs of the images themselves (run-images.sh).

readonly kComposeSubset="--width 8 --train-limit 1024 --test-limit 256 --epochs 1 --threads 1"

compose_run_services() {
  local work_dir=$1
  local volume=dptrain-check-compose
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  podman volume create "$volume" >/dev/null
  local services
  services=$(/usr/bin/python3 docker/check/compose_runs.py --volume "$volume" \
               --append "train=$kComposeSubset" --append "download=--url file:///mirror/" \
               --mount "$kMirrorSource:/mirror:ro" docker/compose.yaml docker/compose.cpu.yaml)
  local name args log status image run_args=()
  while IFS=$'\t' read -r name args; do
    log=$work_dir/compose-$name.log
    eval "run_args=($args)"  # compose_runs.py quoted them for the shell
    image=$(printf '%s\n' "${run_args[@]}" | grep -m1 ':latest$')
    if ! podman image exists "$image"; then
      record_run "$image" "compose: $name" "not run" "image not built"
      continue
    fi
    status=0
    podman run --rm "${run_args[@]}" >"$log" 2>&1 </dev/null || status=$?
    if [ "$name" = download ]; then
      compose_check_download "$volume" "$log" "$status"
    elif [ "$status" -eq 0 ] && grep -q '^test acc' "$log"; then
      record_run "$image" "compose: $name" pass "$(last_line "$log")"
    else
      record_run "$image" "compose: $name" "fail (exit $status)" "$(last_line "$log")"
    fi
  done <<<"$services"
  podman volume rm -f "$volume" >/dev/null
}

# As in run-images.sh, Debian's recompressed files fail download's SHA-256 check; the training
# services then read the same files, copied into the volume, as a finished download leaves them.
compose_check_download() {
  local volume=$1 log=$2 status=$3
  if [ "$status" -eq 0 ]; then
    record_run dptrain-cpu:latest "compose: download" pass "$(last_line "$log")"
  elif grep -q 'SHA-256 mismatch' "$log"; then
    record_run dptrain-cpu:latest "compose: download" "pass*" "$(last_line "$log" | cut -c1-110)..."
  else
    record_run dptrain-cpu:latest "compose: download" "fail (exit $status)" "$(last_line "$log")"
  fi
  podman run --rm --network none -v "$volume:/data" -v "$kMirrorSource:/mirror:ro" \
    --entrypoint /bin/sh dptrain-cpu:latest -c 'cp /mirror/*.gz /data/fashion-mnist/' >/dev/null
}
