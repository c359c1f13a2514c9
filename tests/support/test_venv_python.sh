#!/usr/bin/env bash
# Runs a Python test under the tests' venv (.venv-tests, made by scripts/test-venv.sh), or fails
# in one line saying how to make it: a test that needs another project's own reader must not pass
# or skip quietly where that reader is missing. Not a venv maker itself.
# Usage: test_venv_python.sh <venv python> <script> [args...]
set -uo pipefail
python=$1
shift
if [ ! -x "$python" ] || ! "$python" -c "import tensorboard, safetensors" 2>/dev/null; then
  echo "error: the tests' Python $python is missing or lacks tensorboard/safetensors: run scripts/test-venv.sh" >&2
  exit 1
fi
exec "$python" "$@"
