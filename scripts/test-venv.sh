#!/usr/bin/env bash
# Makes .venv-tests, the Python the tests that read our files with other projects' own readers
# run under (TensorBoard's event reader, PyPI safetensors), with the include check's clang-tidy,
# and does nothing when it is already as pinned here. Not the GPU machine's LibTorch venv (.venv-torch, scripts/quickstart.sh).
# scripts/test.sh runs it; CTest finds the venv through DPTRAIN_TEST_PYTHON (tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DPTRAIN_TEST_VENV:-$PWD/.venv-tests}"

# Pinned, so that a test's reader is the same on every machine: versions that install on Debian
# 12's Python 3.11 and import beside its python3-torch 1.13 and numpy 1.24. TensorBoard's own
# generated *_pb2.py files run on the protobuf pinned here (pip's, not Debian's).
pins=(
  tensorboard==2.20.0   # EventAccumulator reads --tensorboard's event files
  protobuf==7.36.2      # the runtime TensorBoard's reader parses the events with
  safetensors==0.6.2    # safetensors.torch.load_file reads --save-model and checkpoint files
  clang-tidy==23.1.4    # misc-include-cleaner, tests/include_check.py (Debian 12's is 14)
)

# Debian's interpreter, not one earlier in PATH (pyenv's, say): --system-site-packages is there so
# that Debian's python3-torch and numpy stay visible inside the venv.
python=/usr/bin/python3
[ -x "$python" ] || python=python3
stamp="$venv/dptrain-pins.txt"
if [ -x "$venv/bin/python3" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${pins[*]}" ]; then
  echo "test-venv: $venv as pinned"
  exit 0
fi
echo "test-venv: making $venv (${pins[*]})"
"$python" -m venv --system-site-packages "$venv"
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
"$venv/bin/python3" -c "import tensorboard.backend.event_processing.event_accumulator, safetensors.torch"
"$venv/bin/clang-tidy" --version >/dev/null
printf '%s' "${pins[*]}" >"$stamp"
echo "test-venv: $venv ready"
