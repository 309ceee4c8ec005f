#!/usr/bin/env bash
# Create .venv and install geodml with its test extra. Idempotent: a second run only checks.
# CPU by default: torch==2.13.0 is installed first (a local CPU build on our machines), so pip
# never pulls a multi-GB CUDA build. GPU users: create .venv with your CUDA torch installed
# first (or set GEODML_TORCH="torch==X.Y.Z" to the build you want); bootstrap keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GEODML_VENV:-.venv}
STAMP="$VENV/.geodml-installed"
# Up to date: installed after the last change to pyproject.toml and to the C kernels' source.
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt geodml/_kernels.c ] \
   && "$VENV/bin/python" -c "import geodml, torch, zmq, msgpack, sklearn, pytest, xdist, greenlet" 2>/dev/null; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "bootstrap: installing ${GEODML_TORCH:-torch==2.13.0} into $VENV" >&2
  $PIP install "${GEODML_TORCH:-torch==2.13.0}"
fi
echo "bootstrap: installing geodml (editable; builds its optional C kernels) and test tools into $VENV" >&2
$PIP install -e ".[test]"
touch "$STAMP"
