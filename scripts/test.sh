#!/usr/bin/env bash
# The second of the README's two commands: builds dptrain with its tests and runs them all with
# CTest. Needs what scripts/install-deps.sh installs (scripts/quickstart.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh -DBUILD_TESTING=ON
cd "${DPTRAIN_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${DPTRAIN_TEST_JOBS:-1}"
