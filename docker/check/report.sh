# shellcheck shell=bash
# Sourced by docker/check.sh: prints the check's table from the lines the builds and runs
# recorded (NAME|built|seconds, IMAGE|what|result|line), and says whether anything failed.
# Not here: deciding pass or fail (the runs do).

# What each image is built on, as docker/check.sh passes it.
image_base() {
  case $1 in
    dptrain-cpu:latest) echo "Debian 12 (debootstrap minbase)" ;;
    dptrain:latest) echo "CUDA 13 stand-ins (Debian 12 + local toolkit)" ;;
    dptrain-torchrun:latest) echo "CUDA 13 devel stand-in (the builder)" ;;
    *) echo "-" ;;
  esac
}

report_table() {
  local builds=$1 runs=$2
  local name built seconds image what result line
  echo
  echo "== images"
  printf '%-48s %-46s %-6s %-9s %s\n' image base built size "build time"
  for name in "$kDebianBase" "$kCudaDevelStandIn" "$kCudaBaseStandIn"; do
    printf '%-48s %-46s %-6s %-9s %s\n' "$name" "(a base, made by the check)" cached \
      "$(image_size "$name")" "-"
  done
  while IFS='|' read -r name built seconds; do
    printf '%-48s %-46s %-6s %-9s %s\n' "$name" "$(image_base "$name")" "$built" \
      "$(image_size "$name")" "$((seconds / 60)) min $((seconds % 60)) s"
  done <"$builds"
  echo
  echo "== runs (--network none unless said)"
  printf '%-24s %-46s %-8s %s\n' image run result "result line"
  while IFS='|' read -r image what result line; do
    printf '%-24s %-46s %-8s %s\n' "$image" "$what" "$result" "$line"
  done <"$runs"
  echo "(dptrain-torchrun's build reuses the builder layers that dptrain's build just made)"
  echo "(pass*: download reached the mirror and refused Debian's recompressed files by SHA-256)"
}

# Succeeds when every build succeeded and no run failed.
report_all_passed() {
  ! grep -q '|no|' "$1" && ! cut -d'|' -f3 "$2" | grep -q '^fail'
}
