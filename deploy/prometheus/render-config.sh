#!/usr/bin/env bash
# Writes a Prometheus configuration for a run of deploy/local/launch.sh: the coordinator and
# worker metrics endpoints of DIR/endpoints.json, rules.yml, from prometheus.yml.in.
#
#   deploy/prometheus/render-config.sh DIR [SCRAPE_INTERVAL]   # writes DIR/prometheus.yml
#   prometheus --config.file DIR/prometheus.yml --storage.tsdb.path DIR/prometheus \
#     --web.listen-address 127.0.0.1:9090
set -euo pipefail

usage() { echo "usage: $0 DIR [SCRAPE_INTERVAL (default 5s)]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
DIR=$1
INTERVAL=${2:-5s}
HERE=$(cd "$(dirname "$0")" && pwd)
ENDPOINTS="$DIR/endpoints.json"
[ -r "$ENDPOINTS" ] || { echo "$0: cannot read $ENDPOINTS (written by deploy/local/launch.sh)" >&2; exit 2; }
[[ "$INTERVAL" =~ ^[0-9]+(ms|s|m)$ ]] || { echo "$0: bad interval '$INTERVAL' (e.g. 5s)" >&2; exit 2; }

# "http://127.0.0.1:41234/metrics" → "127.0.0.1:41234", quoted, comma-separated.
targets() {
  { grep -o "\"$1\": *\\(\"[^\"]*\"\\|\\[[^]]*\\]\\)" "$ENDPOINTS" || true; } |
    { grep -o 'http://[^/"]*' || true; } | sed 's|http://||; s|.*|"&"|' | paste -sd, - |
    sed 's/,/, /g'
}
COORDINATOR=$(targets coordinator_metrics)
WORKERS=$(targets worker_metrics)
[ -n "$COORDINATOR" ] || { echo "$0: no coordinator_metrics in $ENDPOINTS" >&2; exit 1; }

sed -e "s|@SCRAPE_INTERVAL@|$INTERVAL|g" -e "s|@RULE_FILE@|$HERE/rules.yml|g" \
    -e "s|@COORDINATOR_TARGETS@|$COORDINATOR|g" -e "s|@WORKER_TARGETS@|$WORKERS|g" \
    "$HERE/prometheus.yml.in" >"$DIR/prometheus.yml.tmp"
mv "$DIR/prometheus.yml.tmp" "$DIR/prometheus.yml"
echo "$DIR/prometheus.yml: coordinator [$COORDINATOR], workers [$WORKERS]" >&2
