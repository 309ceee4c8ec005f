#!/usr/bin/env bash
# The README's second command: bootstrap, then the whole test suite (CPU, gloo).
# Extra arguments go to pytest (e.g. launch/test.sh -k partition).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/bootstrap.sh
# The Prometheus integration test needs a real server: install the Debian package when it is
# missing and we may (root + apt). Quiet and idempotent; if it cannot, that test skips and says why.
# The Fashion-MNIST reader test reads the real Debian dataset package the same way.
missing=""
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing="$missing dataset-fashion-mnist"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing Debian packages:$missing (integration tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -q --no-install-recommends $missing || { apt-get update -q && apt-get install -y -q --no-install-recommends $missing; }; } \
    >/dev/null 2>&1 || echo "test: could not install$missing; the tests that need them will skip and say why" >&2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q "$@"
