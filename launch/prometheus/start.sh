#!/usr/bin/env bash
# Start Prometheus (Debian package `prometheus`) against geodml runs, with the geodml console.
#   launch/prometheus/start.sh [--link-only] [RUN_DIR ...]
#   launch/prometheus/start.sh --install-consoles [DIR]
# Links each RUN_DIR/prometheus_targets.json (default: every runs/*/ that has one) into
# launch/prometheus/targets/<run>.json, then runs Prometheus in the foreground with
# launch/prometheus/prometheus.yml and the console templates of consoles/ and console_libraries/:
# the live dashboard is http://LISTEN/consoles/geodml.html (README "Monitoring"). A run directory
# that does not exist yet can be linked ahead (choose its --out first); Prometheus reads it once
# the run writes it. --link-only adds links for a Prometheus that is already running.
# --install-consoles copies geodml.html and geodml.lib into DIR/consoles and DIR/console_libraries
# (default /etc/prometheus, what Debian's prometheus service serves; read per request, no restart).
# The console draws with the graph libraries Prometheus serves under /classic/static/ (Debian: the
# packages libjs-rickshaw, libjs-d3, libjs-jquery and libjs-bootstrap4, dependencies of prometheus).
# Environment: GEODML_PROMETHEUS_LISTEN (default 127.0.0.1:9090), GEODML_PROMETHEUS_DATA
# (default runs/.prometheus), GEODML_PROMETHEUS_RETENTION (default 15d), GEODML_PROMETHEUS_CONFIG
# (default prometheus.yml here; its file_sd paths are relative to it) and GEODML_PROMETHEUS_TARGETS
# (where the links go, default targets/ here: the directory that config reads), GEODML_PROMETHEUS_ARGS
# (more prometheus flags, e.g. --log.level=warn).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ "${1:-}" = "--install-consoles" ]; then
  dest=${2:-/etc/prometheus}
  mkdir -p "$dest/consoles" "$dest/console_libraries"
  # copies, not links: a service user may not be able to read this checkout
  install -m 0644 "$here/consoles/geodml.html" "$dest/consoles/geodml.html"
  install -m 0644 "$here/console_libraries/geodml.lib" "$dest/console_libraries/geodml.lib"
  echo "prometheus: console installed in $dest: /consoles/geodml.html of a Prometheus serving those directories" >&2
  exit 0
fi
link_only=0
if [ "${1:-}" = "--link-only" ]; then link_only=1; shift; fi
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  shopt -s nullglob
  for f in "$repo"/runs/*/prometheus_targets.json; do runs+=("$(dirname "$f")"); done
fi
config=${GEODML_PROMETHEUS_CONFIG:-$here/prometheus.yml}
targets=${GEODML_PROMETHEUS_TARGETS:-$here/targets}
mkdir -p "$targets"
for r in "${runs[@]}"; do
  abs=$(cd "$(dirname "$r")" 2>/dev/null && pwd)/$(basename "$r")
  ln -sfn "$abs/prometheus_targets.json" "$targets/$(basename "$abs").json"
  echo "prometheus: scraping run $(basename "$abs") (targets: $abs/prometheus_targets.json)" >&2
done
[ "$link_only" = 1 ] && exit 0
if ! command -v prometheus >/dev/null 2>&1; then
  echo "prometheus: not installed; on Debian/Ubuntu: sudo apt-get install prometheus" >&2
  exit 1
fi
data=${GEODML_PROMETHEUS_DATA:-$repo/runs/.prometheus}
mkdir -p "$data"
listen=${GEODML_PROMETHEUS_LISTEN:-127.0.0.1:9090}
echo "prometheus: http://$listen, geodml dashboard http://$listen/consoles/geodml.html (data in $data)" >&2
exec prometheus --config.file="$config" --web.listen-address="$listen" \
  --web.console.templates="$here/consoles" --web.console.libraries="$here/console_libraries" \
  --storage.tsdb.path="$data" --storage.tsdb.retention.time="${GEODML_PROMETHEUS_RETENTION:-15d}" \
  ${GEODML_PROMETHEUS_ARGS:-}
