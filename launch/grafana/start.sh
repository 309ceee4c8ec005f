#!/usr/bin/env bash
# Start Grafana with the geodml datasource and dashboard provisioned (README "Monitoring").
#   launch/grafana/start.sh
# Uses a native Grafana (`grafana` or `grafana-server` on PATH; GRAFANA_HOME, default
# /usr/share/grafana) or else Docker (image GEODML_GRAFANA_IMAGE, default grafana/grafana:11.3.0).
# Listens on 127.0.0.1:3000 (GEODML_GRAFANA_ADDR / GEODML_GRAFANA_PORT); anonymous viewers allowed.
# Expects Prometheus at http://127.0.0.1:9090 (launch/prometheus/start.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
addr=${GEODML_GRAFANA_ADDR:-127.0.0.1}
port=${GEODML_GRAFANA_PORT:-3000}
export GF_SERVER_HTTP_ADDR="$addr" GF_SERVER_HTTP_PORT="$port"
export GF_AUTH_ANONYMOUS_ENABLED=true GF_AUTH_ANONYMOUS_ORG_ROLE=Viewer
export GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=/etc/grafana/provisioning/dashboards/geodml.json
echo "grafana: http://$addr:$port/d/geodml (admin/admin on first login)" >&2
if command -v grafana >/dev/null 2>&1 || command -v grafana-server >/dev/null 2>&1; then
  export GF_PATHS_PROVISIONING="$here/provisioning"
  export GF_PATHS_DATA=${GEODML_GRAFANA_DATA:-$repo/runs/.grafana}
  export GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH="$here/provisioning/dashboards/geodml.json"
  mkdir -p "$GF_PATHS_DATA"
  home=${GRAFANA_HOME:-/usr/share/grafana}
  if command -v grafana >/dev/null 2>&1; then exec grafana server --homepath "$home"; fi
  exec grafana-server --homepath "$home"
elif command -v docker >/dev/null 2>&1; then
  exec docker run --rm --network host -v "$here/provisioning:/etc/grafana/provisioning:ro" \
    -e GF_SERVER_HTTP_ADDR -e GF_SERVER_HTTP_PORT -e GF_AUTH_ANONYMOUS_ENABLED -e GF_AUTH_ANONYMOUS_ORG_ROLE \
    -e GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH "${GEODML_GRAFANA_IMAGE:-grafana/grafana:11.3.0}"
else
  echo "grafana: neither a grafana binary nor docker found; install Grafana (https://grafana.com/grafana/download)" >&2
  echo "  and run it with GF_PATHS_PROVISIONING=$here/provisioning" >&2
  exit 1
fi
