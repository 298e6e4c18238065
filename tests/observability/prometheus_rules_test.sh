#!/usr/bin/env bash
# deploy/prometheus with promtool: rules.yml passes `promtool check rules`, its unit tests
# (rules_test.yml) pass `promtool test rules`, and render-config.sh turns a launch.sh
# endpoints.json (with workers, and without) into a config `promtool check config` accepts.
# Exit 77 (ctest: skipped) when promtool is not installed.
set -uo pipefail
ROOT=${1:?usage: $0 SOURCE_DIR}
PROM="$ROOT/deploy/prometheus"
PROMTOOL=$(command -v promtool || true)
if [ -z "$PROMTOOL" ]; then
  echo "SKIP: promtool not found; it comes with the Debian package 'prometheus' (scripts/install-deps.sh)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
step() {
  local what=$1; shift
  if out=$("$@" 2>&1); then
    echo "ok: $what"
  else
    echo "FAILED: $what"; echo "$out"; fail=1
  fi
}

step "promtool check rules rules.yml" "$PROMTOOL" check rules "$PROM/rules.yml"
step "promtool test rules rules_test.yml" bash -c "cd '$PROM' && '$PROMTOOL' test rules rules_test.yml"

mkdir -p "$TMP/with" "$TMP/without"
cat >"$TMP/with/endpoints.json" <<'JSON'
{"coordinator": "127.0.0.1:40000", "coordinator_metrics": "http://127.0.0.1:40001/metrics", "worker_metrics": ["http://127.0.0.1:40002/metrics", "http://127.0.0.1:40003/metrics"], "job": "job-1"}
JSON
cat >"$TMP/without/endpoints.json" <<'JSON'
{"coordinator": "127.0.0.1:40000", "coordinator_metrics": "http://127.0.0.1:40001/metrics", "worker_metrics": [], "job": "job-1"}
JSON
for d in with without; do
  step "render-config.sh ($d workers)" "$PROM/render-config.sh" "$TMP/$d" 2s
  step "promtool check config ($d workers)" "$PROMTOOL" check config "$TMP/$d/prometheus.yml"
done
grep -q '"127.0.0.1:40001"' "$TMP/with/prometheus.yml" &&
  grep -q '"127.0.0.1:40002", "127.0.0.1:40003"' "$TMP/with/prometheus.yml" ||
  { echo "FAILED: the rendered targets are not the endpoints':"; cat "$TMP/with/prometheus.yml"; fail=1; }
step "render-config.sh refuses a missing endpoints.json" bash -c "! '$PROM/render-config.sh' '$TMP/none' 2>/dev/null"
exit $fail
