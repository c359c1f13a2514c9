#!/usr/bin/env bash
# Runs a Python test under the tests' venv (.venv-tests, made by scripts/test-venv.sh), or fails
# in one line saying how to make it: a test that needs another project's own reader must not pass
# or skip quietly where that reader is missing, nor end in a traceback. Not a venv maker itself.
# Usage: test_venv_python.sh <venv python> <script> [args...]
set -uo pipefail
python=$1
shift
if [ ! -x "$python" ]; then
  echo "error: the tests' Python $python is missing: run scripts/test-venv.sh" >&2
  exit 1
fi
# What the tests import: the pinned readers from the venv, torch and numpy from Debian's
# python3-torch and python3-numpy, which the venv sees (--system-site-packages).
missing=$("$python" - <<'PYTHON' 2>/dev/null
import importlib.util
print(" ".join(m for m in ("tensorboard", "safetensors", "torch", "numpy")
               if importlib.util.find_spec(m) is None))
PYTHON
) || missing="(its modules could not be listed)"
if [ -n "$missing" ]; then
  echo "error: the tests' Python $python lacks $missing: run scripts/test-venv.sh (torch and numpy come from Debian's python3-torch and python3-numpy, scripts/install-deps.sh)" >&2
  exit 1
fi
exec "$python" "$@"
