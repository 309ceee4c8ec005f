#!/usr/bin/env bash
# The README's second command: bootstrap, then the whole test suite (CPU, gloo).
# Extra arguments go to pytest (e.g. launch/test.sh -k partition).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/bootstrap.sh
# The Prometheus integration tests need a real server, the dashboard tests a headless browser
# (tests/test_dashboard.py renders the console and the HTML report in it): install the Debian
# packages when they are missing and we may (root + apt). The browser is chromium-headless-shell,
# or chromium (it runs headless) where a release lacks that package. Quiet and idempotent; if it
# cannot, those tests skip and say why. The Fashion-MNIST reader test reads the real Debian dataset
# package the same way.
missing=""
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v slurmctld >/dev/null 2>&1 || missing="$missing slurm-wlm"   # tests/test_slurm.py: a real SLURM on loopback
command -v munged >/dev/null 2>&1 || missing="$missing munge"
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing="$missing dataset-fashion-mnist"
browser=""
command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 || browser=chromium-headless-shell
if [ -n "$missing$browser" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing Debian packages:$missing $browser (integration tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; }
  # shellcheck disable=SC2086  # word splitting of the package lists is intended
  apt_install $missing $browser || { apt-get update -q >/dev/null 2>&1; apt_install $missing $browser; } \
    || { [ -n "$browser" ] && apt_install $missing chromium; } \
    || echo "test: could not install$missing $browser; the tests that need them will skip and say why" >&2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Lint and types first (the whole run only; with pytest arguments, just the tests): ruff on
# geodml/ and tests/, mypy on the typed seams ([tool.ruff] and [tool.mypy] in pyproject.toml).
if [ $# -eq 0 ]; then
  echo "test: ruff check geodml tests; mypy (pyproject.toml [tool.mypy] files)" >&2
  .venv/bin/python -m ruff check -q geodml tests
  .venv/bin/python -m mypy
fi
# Both cores (pytest-xdist; GEODML_TEST_WORKERS=0 runs in this process): most tests are one-threaded
# runs of geodml, so two workers nearly halve the wall time on CI's 2 cores.
exec .venv/bin/python -m pytest -q -n "${GEODML_TEST_WORKERS:-2}" --dist worksteal "$@"
