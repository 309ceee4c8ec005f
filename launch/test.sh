#!/usr/bin/env bash
# The README's second command: bootstrap, then the whole test suite (CPU, gloo).
# Extra arguments go to pytest (e.g. launch/test.sh -k partition).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/bootstrap.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q "$@"
