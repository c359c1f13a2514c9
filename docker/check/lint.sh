#!/usr/bin/env bash
# The fast part of docker/check.sh (--lint, for CI): checks, without podman or Docker, that
# docker/Dockerfile still fits the repository: it builds with scripts/build.sh and the same flags
# as quickstart.sh's GPU path, the binary path it copies matches build.sh's build directory,
# every COPY --from names something its stage made, and ENTRYPOINT finds the binary on PATH.
# It does not build or run an image (docker/check.sh without --lint does).
# Usage: bash docker/check.sh --lint   (DOCKERFILE=... to check another file)
set -euo pipefail
cd "$(dirname "$0")/../.."
dockerfile=${DOCKERFILE:-docker/Dockerfile}
compose=${COMPOSE:-docker/compose.yaml}

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok:   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

# Logical lines: continuations joined, comment lines dropped, each prefixed with its stage name
# (the FROM's AS name, else its index) and a tab.
logical_lines() {
  awk '
    /^[[:space:]]*#/ { next }
    { line = line $0 }
    /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, " ", line); next }
    line ~ /^[[:space:]]*$/ { line = ""; next }
    {
      if (toupper(line) ~ /^[[:space:]]*FROM[[:space:]]/) {
        stage = ++count
        n = split(line, w, /[[:space:]]+/)
        for (i = 1; i < n; i++) if (toupper(w[i]) == "AS") stage = w[i + 1]
      }
      print stage "\t" line
      line = ""
    }' "$1"
}
# The argument text after "scripts/build.sh", up to a pipe, && or the end, spaces squeezed.
build_flags() {
  sed -n 's/.*scripts\/build\.sh\(.*\)/\1/p' | head -n 1 | sed 's/[|&].*//' | tr -s ' ' |
    sed 's/^ //; s/ $//'
}

lines=$(logical_lines "$dockerfile")
final_stage=$(printf '%s\n' "$lines" | tail -n 1 | cut -f 1)
stage_lines() { printf '%s\n' "$lines" | awk -F '\t' -v s="$1" '$1 == s { print $2 }'; }

# ---- The build: scripts/build.sh, its build directory, quickstart.sh's flags --------------------
build_line=$(printf '%s\n' "$lines" | cut -f 2 | grep -E '^RUN .*bash scripts/build\.sh' || true)
if [ -z "$build_line" ]; then
  fail "$dockerfile never runs 'bash scripts/build.sh'"
  build_dir=""
else
  pass "$dockerfile builds with bash scripts/build.sh"
  build_dir=$(printf '%s\n' "$build_line" | sed -n 's/.*DPTRAIN_BUILD_DIR=\([^[:space:]]*\).*/\1/p')
  if [ -z "$build_dir" ]; then
    build_dir=build
    pass "no DPTRAIN_BUILD_DIR: build.sh's default, $build_dir"
  fi
fi
# shellcheck disable=SC2016  # the text of build.sh, not an expansion
if printf '%s\n' "$build_line" | grep -q 'DPTRAIN_WERROR=OFF' &&
   grep -qF 'DPTRAIN_WERROR="${DPTRAIN_WERROR:-ON}"' scripts/build.sh; then
  pass "the image builds without -Werror (DPTRAIN_WERROR=OFF, read by build.sh)"
else
  fail "the image must build with DPTRAIN_WERROR=OFF, which scripts/build.sh must read"
fi
# shellcheck disable=SC2016  # the text of build.sh, not an expansion
if grep -qF '"${DPTRAIN_BUILD_DIR:-build}"' scripts/build.sh; then
  pass "scripts/build.sh builds into \$DPTRAIN_BUILD_DIR (here: $build_dir)"
else
  fail "scripts/build.sh no longer reads DPTRAIN_BUILD_DIR the way this check expects"
fi

quickstart_flags=$(logical_lines scripts/quickstart.sh | cut -f 2 |
                   { grep 'DPTRAIN_BUILD_DIR=' || true; } | build_flags)
docker_flags=$(printf '%s\n' "$build_line" | build_flags)
if [ -n "$docker_flags" ] && [ "$docker_flags" = "$quickstart_flags" ]; then
  pass "same build.sh flags as quickstart.sh's GPU path: $docker_flags"
else
  fail "build.sh flags differ: Dockerfile '$docker_flags', quickstart.sh '$quickstart_flags'"
fi

# The binary: app/CMakeLists.txt names it dptrain, in <build dir>/app/.
if grep -q 'OUTPUT_NAME dptrain' app/CMakeLists.txt; then
  built="$build_dir/app/dptrain"
else
  fail "app/CMakeLists.txt no longer names the binary dptrain"
  built="$build_dir/app/dptrain"
fi
staged=$(printf '%s\n' "$lines" | cut -f 2 | { grep -F " $built " || true; } |
         sed -n "s|.* ${built}[[:space:]][[:space:]]*\\([^[:space:]&;]*\\).*|\\1|p" | head -n 1)
if [ -n "$staged" ]; then
  pass "the builder takes $built (to $staged)"
else
  fail "no RUN line copies $built, the binary scripts/build.sh makes"
fi

# ---- COPY --from: the stage exists and made the path -------------------------------------------
final_binary=""
while IFS=$'\t' read -r stage line; do
  read -r -a words <<<"$line"
  from="" args=()
  for word in "${words[@]:1}"; do
    case $word in
      --from=*) from=${word#--from=} ;;
      --*) ;;
      *) args+=("$word") ;;
    esac
  done
  [ -n "$from" ] || continue
  src=${args[0]:-}
  dst=${args[-1]:-}
  if [ "${#args[@]}" -ne 2 ]; then
    fail "'$line': expected one source and one destination"
  elif ! printf '%s\n' "$lines" | cut -f 1 | grep -qxF "$from"; then
    fail "'$line': no stage named $from"
  elif ! stage_lines "$from" | grep -v '^COPY --from' | grep -qF "$src"; then
    fail "'$line': stage $from never mentions $src"
  else
    pass "COPY --from=$from $src: made in stage $from"
  fi
  if [ "$stage" = "$final_stage" ] && [ -n "$staged" ]; then
    case $staged in
      "$src") final_binary=$dst ;;
      "$src"/*) final_binary=${dst%/}/${staged#"$src"/} ;;
    esac
  fi
done < <(printf '%s\n' "$lines" | grep -P '^[^\t]*\tCOPY .*--from=')

# ---- ENTRYPOINT: the final stage's binary, found on its PATH ------------------------------------
entry=$(stage_lines "$final_stage" | sed -n 's/^ENTRYPOINT[[:space:]]*\[[[:space:]]*"\([^"]*\)".*/\1/p' |
        tail -n 1)
path_dirs=$(stage_lines "$final_stage" | { grep '^ENV ' || true; } |
            { grep -o '\(^\|[[:space:]]\)PATH=[^[:space:]]*' || true; } | sed 's/.*PATH=//' | tr ':' '\n')
if [ -z "$final_binary" ]; then
  fail "the final stage ($final_stage) copies no binary from $staged"
elif [ -z "$entry" ]; then
  fail "the final stage ($final_stage) has no exec-form ENTRYPOINT"
elif [[ $entry == /* ]]; then
  if [ "$entry" = "$final_binary" ]; then pass "ENTRYPOINT $entry is the copied binary"
  else fail "ENTRYPOINT $entry is not the copied binary $final_binary"; fi
elif [ "$entry" = "$(basename "$final_binary")" ] &&
     printf '%s\n' "$path_dirs" | grep -qxF "$(dirname "$final_binary")"; then
  pass "ENTRYPOINT $entry is $final_binary, on the final stage's PATH"
else
  fail "ENTRYPOINT $entry does not find $final_binary (PATH dirs: ${path_dirs//$'\n'/:})"
fi

# ---- Files from the repository, the build context, compose ---------------------------------------
for file in $(printf '%s\n' "$lines" | cut -f 2 |
              grep -oE '(^|[[:space:]])(scripts|docker)/[A-Za-z0-9_./-]+' | sort -u); do
  if [ -f "$file" ]; then pass "$file exists"; else fail "$dockerfile uses $file, which is missing"; fi
done

ignored=no
while read -r pattern; do
  case $pattern in ''|'#'*) continue ;; esac
  pattern=${pattern%/}
  # shellcheck disable=SC2053  # the pattern is meant as a glob
  if [[ $build_dir == $pattern ]]; then ignored=yes; fi
done < .dockerignore
if [ "$ignored" = yes ]; then
  pass ".dockerignore keeps a local $build_dir out of the image"
else
  fail ".dockerignore does not exclude $build_dir: a local build tree would be copied over"
fi

volume=$(stage_lines "$final_stage" | sed -n 's/^VOLUME[[:space:]]*\([^[:space:]]*\).*/\1/p')
if grep -q "dockerfile: docker/$(basename "$dockerfile")" "$compose" && grep -q ":$volume\$" "$compose"; then
  pass "$compose builds docker/$(basename "$dockerfile") and mounts the data volume at $volume"
else
  fail "$compose does not build $dockerfile or mount the image's VOLUME $volume"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
