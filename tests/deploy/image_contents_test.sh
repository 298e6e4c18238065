#!/usr/bin/env bash
# The images carry the binaries that ship and nothing of the testing build.
# Catches: a Dockerfile that copies build/bin whole (build/bin/testing, the worker with test
# hooks, would ship with it), or one that leaves a shipped binary out.
set -euo pipefail
ROOT=$1
for f in "$ROOT"/deploy/docker/Dockerfile*; do
  copies=$(grep -A1 -E '^COPY --from=build /build/bin' "$f" | tr -d '\\\n')
  [ -n "$copies" ] || { echo "FAIL: $f copies no binary"; exit 1; }
  for b in trainstep trainstep-coordinator trainstep-worker; do
    grep -q -- "/build/bin/$b " <<<"$copies" || { echo "FAIL: $f does not copy $b"; exit 1; }
  done
  if grep -q -E '/build/bin/?( |$)|testing' <<<"$copies"; then
    echo "FAIL: $f copies more than the three shipped binaries: $copies"
    exit 1
  fi
done
echo ok
