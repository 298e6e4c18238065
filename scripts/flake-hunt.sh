#!/usr/bin/env bash
# Runs the tests that start processes or servers (CTest labels integration, conformance, chaos)
# several times each while every core is kept busy by a spinning process, the way a loaded CI
# machine runs them. A test that decides by which thread or process gets there first, or by how
# long something took, fails here long before it fails a CI run.
#
#   scripts/flake-hunt.sh                    every integration/conformance/chaos test, 3 times
#   scripts/flake-hunt.sh REGEX [REPEAT]     the tests whose names match REGEX, REPEAT times
#   FLAKE_ROUNDS=3 scripts/flake-hunt.sh     the whole hunt 3 times in a row (stops at a failure)
#
# Needs a built tree (make build; BUILD_DIR, default build). Exit 0: no failure in any round.
set -u
cd "$(dirname "$0")/.."
regex=${1:-}
repeat=${2:-3}
rounds=${FLAKE_ROUNDS:-1}
build=${BUILD_DIR:-build}
[ -f "$build/CTestTestfile.cmake" ] || { echo "flake-hunt: no built tree in $build/ (run make build)" >&2; exit 2; }
[[ "$repeat" =~ ^[1-9][0-9]*$ && "$rounds" =~ ^[1-9][0-9]*$ ]] ||
  { echo "flake-hunt: REPEAT and FLAKE_ROUNDS must be positive integers" >&2; exit 2; }
hogs=()
for _ in $(seq "$(nproc)"); do (while :; do :; done) & hogs+=($!); done
cleanup() { kill "${hogs[@]}" 2>/dev/null; }
trap cleanup EXIT
sel=(-L 'integration|conformance|chaos')
[ -n "$regex" ] && sel=(-R "$regex")
for round in $(seq "$rounds"); do
  echo "flake-hunt: round $round of $rounds: ${sel[*]}, each up to $repeat times, $(nproc) cores kept busy" >&2
  start=$SECONDS
  ctest --test-dir "$build" "${sel[@]}" --repeat until-fail:"$repeat" --timeout 900 \
    --output-on-failure -j "$(nproc)"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "flake-hunt: round $round failed (above): that test depends on timing or arrival order" >&2
    exit $rc
  fi
  echo "flake-hunt: round $round passed in $((SECONDS - start)) s" >&2
done
echo "flake-hunt: no failure in $rounds round(s) of $repeat runs under load" >&2
