#!/usr/bin/env bash
# deploy/local/launch.sh as a user runs it: bad arguments exit 2; a small job runs to the
# end with endpoints.json and updates.jsonl written and no process left behind; with
# --restart-workers a worker killed mid-run is restarted and the job still succeeds; with
# --bin build/bin/testing the testing build's fault flags reach the workers.
set -uo pipefail
ROOT=$1 BIN=$2
DIR=$(mktemp -d /tmp/trainstep-launch-test.XXXXXX)
trap 'pkill -f -- "$DIR" 2>/dev/null; rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; for f in "$DIR"/*/logs/*.log; do echo "--- $f"; tail -5 "$f"; done; exit 1; }

"$ROOT/deploy/local/launch.sh" --out "$DIR/x" >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing --spec must exit 2"
"$ROOT/deploy/local/launch.sh" --spec "$DIR/none.json" --out "$DIR/x" >/dev/null 2>&1; [ $? -eq 2 ] || fail "unreadable spec must exit 2"

cat >"$DIR/spec.json" <<JSON
{"name":"launch","model":{"mlp":{}},"data":{"synthetic_regression":{"samples":128}},
 "batch":{"micro_batch_size":4,"accumulation_steps":2},"workers":{"count":2},
 "optimizer":{"sgd":{"lr":0.05}},"stop":{"epochs":2}}
JSON
timeout 120 "$ROOT/deploy/local/launch.sh" --spec "$DIR/spec.json" --out "$DIR/run" --bin "$BIN" --worker-flag --device=cpu >"$DIR/run.out" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$DIR/run.out"; fail "launch exited $rc"; }
grep -q '"coordinator": "127.0.0.1:' "$DIR/run/endpoints.json" || fail "endpoints.json lacks the coordinator"
[ "$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$DIR/run/endpoints.json" | wc -l)" -eq 3 ] || fail "endpoints.json lacks metrics URLs"
[ "$(wc -l <"$DIR/run/updates.jsonl")" -eq 16 ] || fail "expected 16 windows in updates.jsonl"
# launch.sh has returned; its children may still be exiting: wait for them (bounded), not a while.
for _ in $(seq 1 100); do pgrep -f -- "$DIR/run" >/dev/null || break; sleep 0.1; done
pgrep -f -- "$DIR/run" >/dev/null && fail "processes left behind"

# A worker killed mid-run is restarted (as Kubernetes would) and the job still succeeds.
sed 's/"epochs":2/"epochs":400/' "$DIR/spec.json" >"$DIR/long.json"
timeout 300 "$ROOT/deploy/local/launch.sh" --spec "$DIR/long.json" --out "$DIR/restart" --bin "$BIN" --worker-flag --device=cpu \
  --restart-workers --coordinator-flag=--worker-lease-ms=1500 >"$DIR/restart.out" 2>&1 &
LAUNCH=$!
# Killed once training is under way (window 20 seen), however long a loaded machine takes to
# get there; never before a generation formed.
started=0
for _ in $(seq 1 1800); do
  [ -s "$DIR/restart/endpoints.json" ] && grep -q 'window 20 ' "$DIR/restart.out" 2>/dev/null && { started=1; break; }
  kill -0 $LAUNCH 2>/dev/null || break
  sleep 0.1
done
[ $started -eq 1 ] || fail "the long job never reached window 20"
victim=$(pgrep -f -- "--port-file $DIR/restart/worker-1.ports" | head -1)
[ -n "$victim" ] || fail "no worker-1 to kill"
kill -9 "$victim"
wait $LAUNCH
rc=$?
[ $rc -eq 0 ] || { tail -20 "$DIR/restart.out"; fail "restart run exited $rc"; }
grep -q "restarting" "$DIR/restart.out" || fail "the killed worker was not restarted"
grep -q '"reason":"WORKER_LOST"' "$DIR/restart/updates.jsonl" || grep -q '"generation":2' "$DIR/restart/updates.jsonl" || fail "no new generation after the kill"

# The testing build (bin/testing: its worker, links to the others) injects a fault a flag
# names: window 3 overflows on rank 0, and is skipped, once.
sed 's/"stop":/"loss_scaler":{"enabled":true},"stop":/' "$DIR/spec.json" >"$DIR/scaled.json"
timeout 120 "$ROOT/deploy/local/launch.sh" --spec "$DIR/scaled.json" --out "$DIR/fault" --bin "$BIN/testing" \
  --worker-flag --device=cpu --worker-flag=--debug-nonfinite-grad-windows=3 >"$DIR/fault.out" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$DIR/fault.out"; fail "launch with the testing build exited $rc"; }
[ "$(grep -c '"reason":"OVERFLOW"' "$DIR/fault/updates.jsonl")" -eq 1 ] || fail "expected one OVERFLOW skip"
grep '"window_id":3,' "$DIR/fault/updates.jsonl" | grep -q '"reason":"OVERFLOW"' || fail "window 3 was not the one skipped"
echo ok
