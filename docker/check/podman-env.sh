# shellcheck shell=bash
# Sourced by docker/check.sh: puts podman and buildah on this machine (from Debian, if missing)
# and points them at a containers.conf under build-docker/, so that the check never edits
# /etc/containers. Not here: the base images (bases.sh) and the builds (build-images.sh).

# Root in this sandbox cannot raise its own limits (crun: setrlimit RLIMIT_NOFILE: Operation not
# permitted), so containers get limits within the current ones; crun 1.8 refuses the machine's
# hybrid cgroups, runc does not. No network settings: every build uses --network host and
# every run --network none, so podman never creates its bridge or touches the firewall.
podman_env_setup() {
  local work_dir=$1
  local missing=()
  local tool
  for tool in podman buildah debootstrap runc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  # catatonit is podman's --init (compose.yaml's `init: true`); Debian only recommends it.
  [ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "check: installing ${missing[*]} from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" uidmap >/dev/null
  fi
  mkdir -p "$work_dir"
  cat > "$work_dir/containers.conf" <<'CONF'
# Written by docker/check.sh; read through CONTAINERS_CONF, never installed in /etc.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
  export CONTAINERS_CONF="$work_dir/containers.conf"
}

# One line that changes if podman touched the host's network: IP forwarding and a hash of the
# firewall rules (iptables and nftables both, whichever this host uses).
host_network_state() {
  local forward iptables_sum nft_sum
  forward=$(sysctl -n net.ipv4.ip_forward)
  iptables_sum=$( { iptables-save 2>/dev/null || true; } | grep -v '^#' | md5sum | cut -c1-12)
  nft_sum=$( { nft list ruleset 2>/dev/null || true; } | md5sum | cut -c1-12)
  echo "ip_forward=$forward iptables-save=$iptables_sum nft=$nft_sum"
}
