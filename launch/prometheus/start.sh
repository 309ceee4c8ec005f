#!/usr/bin/env bash
# Start Prometheus (Debian package `prometheus`) against geodml runs.
#   launch/prometheus/start.sh [--link-only] [RUN_DIR ...]
# Links each RUN_DIR/prometheus_targets.json (default: every runs/*/ that has one) into
# launch/prometheus/targets/<run>.json, then runs Prometheus in the foreground with
# launch/prometheus/prometheus.yml. A run directory that does not exist yet can be linked
# ahead (choose its --out first); Prometheus reads it once the run writes it. --link-only
# adds links for a Prometheus that is already running.
# Environment: GEODML_PROMETHEUS_LISTEN (default 127.0.0.1:9090), GEODML_PROMETHEUS_DATA
# (default runs/.prometheus), GEODML_PROMETHEUS_RETENTION (default 15d).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
link_only=0
if [ "${1:-}" = "--link-only" ]; then link_only=1; shift; fi
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  shopt -s nullglob
  for f in "$repo"/runs/*/prometheus_targets.json; do runs+=("$(dirname "$f")"); done
fi
mkdir -p "$here/targets"
for r in "${runs[@]}"; do
  abs=$(cd "$(dirname "$r")" 2>/dev/null && pwd)/$(basename "$r")
  ln -sfn "$abs/prometheus_targets.json" "$here/targets/$(basename "$abs").json"
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
echo "prometheus: http://$listen (data in $data)" >&2
exec prometheus --config.file="$here/prometheus.yml" --web.listen-address="$listen" \
  --storage.tsdb.path="$data" --storage.tsdb.retention.time="${GEODML_PROMETHEUS_RETENTION:-15d}"
