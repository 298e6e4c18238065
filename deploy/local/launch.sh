#!/usr/bin/env bash
# One machine, real processes: a coordinator and N workers on 127.0.0.1, the job submitted
# and watched, every process stopped on exit. Exits with the job's result (the codes of
# `trainstep job watch`: 0 succeeded, 5 failed, 6 cancelled).
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: deploy/local/launch.sh --spec SPEC.json --out DIR [--workers N] [--restart-workers]
                              [--bin DIR] [--coordinator-flag FLAG]... [--worker-flag FLAG]...

  --spec FILE          the job spec (JSON); see README "Job spec"
  --out DIR            state, logs, checkpoints (if the spec says so), endpoints.json and
                       updates.jsonl go here; created if missing
  --workers N          worker processes to start (default: the spec's workers.count)
  --restart-workers    restart a worker that exits with an error, as Kubernetes would
  --bin DIR            where trainstep, trainstep-coordinator and trainstep-worker are
                       (default: build/bin of this checkout; build/bin/testing: the
                       testing build, whose worker takes the --debug-* fault flags of
                       docs/development.md)
  --coordinator-flag F / --worker-flag F
                       extra flags for those processes (repeatable)

Worker i gets LOCAL_RANK=i, as torchrun sets it: on a machine with GPUs and a CUDA build,
their default --device auto puts worker i on cuda:i (pass --worker-flag --device=cpu to
train on the CPU instead).

Writes DIR/endpoints.json as soon as everything listens:
  {"coordinator": "127.0.0.1:PORT", "coordinator_metrics": "http://…/metrics",
   "worker_metrics": ["http://…/metrics", …]}
and DIR/updates.jsonl (the per-update log) when the job ends. Ctrl-C stops everything.
Workers get LOCAL_WORLD_SIZE=N (unless it is set), so each uses cores/N compute threads.
EOF
}

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SPEC="" OUT="" WORKERS="" RESTART=0 BIN="$ROOT/build/bin"
COORD_FLAGS=() WORKER_FLAGS=()
while [ $# -gt 0 ]; do
  # --flag=value is the same as --flag value.
  if [[ "$1" == --*=* ]]; then
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case "$1" in
    --spec) SPEC=${2:-}; shift 2 ;;
    --out) OUT=${2:-}; shift 2 ;;
    --workers) WORKERS=${2:-}; shift 2 ;;
    --restart-workers) RESTART=1; shift ;;
    --bin) BIN=${2:-}; shift 2 ;;
    --coordinator-flag) COORD_FLAGS+=("${2:-}"); shift 2 ;;
    --worker-flag) WORKER_FLAGS+=("${2:-}"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "launch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$SPEC" ] || { echo "launch.sh: --spec is required (see --help)" >&2; exit 2; }
[ -n "$OUT" ] || { echo "launch.sh: --out is required (see --help)" >&2; exit 2; }
[ -r "$SPEC" ] || { echo "launch.sh: cannot read spec $SPEC" >&2; exit 2; }
if [ -n "$WORKERS" ] && ! [[ "$WORKERS" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch.sh: --workers must be a positive integer, got '$WORKERS'" >&2; exit 2
fi
for b in trainstep trainstep-coordinator trainstep-worker; do
  [ -x "$BIN/$b" ] || { echo "launch.sh: $BIN/$b not found: run \`make build\` first" >&2; exit 2; }
done

mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
SUPERVISORS=()

# Workers are found by their --port-file, which names this run's DIR: no other launch's
# processes are touched.
worker_pids() { pgrep -f -- "--port-file $OUT/worker-" 2>/dev/null; }

stop_all() {
  for p in ${SUPERVISORS[@]+"${SUPERVISORS[@]}"}; do kill "$p" 2>/dev/null; done
  for p in $(worker_pids) ${COORD_PID:-}; do kill "$p" 2>/dev/null; done
  # Give them the coordinator's drain time, then make sure.
  for _ in $(seq 1 50); do
    [ -z "$(worker_pids)" ] && ! kill -0 "${COORD_PID:-0}" 2>/dev/null && break
    sleep 0.1
  done
  for p in $(worker_pids) ${COORD_PID:-}; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap 'stop_all' EXIT
trap 'echo "launch.sh: interrupted; stopping every process" >&2; exit 130' INT TERM

# Waits for a {"name": N} port file; prints N.
wait_port() {
  local file=$1 key=$2 what=$3 pid=$4
  for _ in $(seq 1 300); do
    if [ -s "$file" ]; then
      sed -n "s/.*\"$key\": *\([0-9]*\).*/\1/p" "$file"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "launch.sh: $what exited; see its log" >&2; return 1; }
    sleep 0.1
  done
  echo "launch.sh: $what did not start within 30 s" >&2
  return 1
}

rm -f "$OUT/coordinator.ports" "$OUT/endpoints.json"  # a reused DIR must not point at the last run
"$BIN/trainstep-coordinator" --listen 127.0.0.1:0 --state-dir "$OUT/state" \
  --metrics-listen 127.0.0.1:0 --port-file "$OUT/coordinator.ports" \
  ${COORD_FLAGS[@]+"${COORD_FLAGS[@]}"} >"$OUT/logs/coordinator.log" 2>&1 &
COORD_PID=$!
GRPC_PORT=$(wait_port "$OUT/coordinator.ports" grpc_port coordinator "$COORD_PID") || { tail -5 "$OUT/logs/coordinator.log" >&2; exit 1; }
METRICS_PORT=$(sed -n 's/.*"metrics_port": *\([0-9]*\).*/\1/p' "$OUT/coordinator.ports")
export TRAINSTEP_COORDINATOR="127.0.0.1:$GRPC_PORT"
echo "coordinator on $TRAINSTEP_COORDINATOR (log: $OUT/logs/coordinator.log)" >&2

JOB=$("$BIN/trainstep" job submit "$SPEC") || exit $?
echo "submitted $JOB" >&2
if [ -z "$WORKERS" ]; then
  WORKERS=$("$BIN/trainstep" job get "$JOB" -o json | tr -d ' \n' | sed -n 's/.*"workers":{"count":\([0-9]*\).*/\1/p')
  WORKERS=${WORKERS:-1}
fi

# Every worker runs on this host: LOCAL_WORLD_SIZE (torchrun's name) lets each take its share
# of the cores (cores / workers threads) instead of all of them. A value already set wins.
export LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE:-$WORKERS}

# One worker, restarted on failure while the job runs (--restart-workers).
run_worker() {
  local i=$1 attempt=0
  while :; do
    LOCAL_RANK=$i "$BIN/trainstep-worker" --job "$JOB" --name "worker-$i" --metrics-listen 127.0.0.1:0 \
      --port-file "$OUT/worker-$i.ports" ${WORKER_FLAGS[@]+"${WORKER_FLAGS[@]}"} \
      >>"$OUT/logs/worker-$i.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] && return 0
    [ $RESTART -eq 1 ] || return $rc
    attempt=$((attempt + 1))
    echo "launch.sh: worker-$i exited with $rc; restarting (attempt $attempt)" >&2
    sleep 1
  done
}

WORKER_METRICS=()
for i in $(seq 0 $((WORKERS - 1))); do
  rm -f "$OUT/worker-$i.ports"
  run_worker "$i" &
  SUPERVISORS+=($!)
done
for i in $(seq 0 $((WORKERS - 1))); do
  port=$(wait_port "$OUT/worker-$i.ports" metrics_port "worker-$i" "${SUPERVISORS[$i]}") || { tail -5 "$OUT/logs/worker-$i.log" >&2; exit 1; }
  WORKER_METRICS+=("\"http://127.0.0.1:$port/metrics\"")
done
{
  printf '{"coordinator": "127.0.0.1:%s", "coordinator_metrics": "http://127.0.0.1:%s/metrics", ' "$GRPC_PORT" "$METRICS_PORT"
  printf '"worker_metrics": [%s], "job": "%s"}\n' "$(IFS=,; echo "${WORKER_METRICS[*]}" | sed 's/,/, /g')" "$JOB"
} >"$OUT/endpoints.json.tmp" && mv "$OUT/endpoints.json.tmp" "$OUT/endpoints.json"
echo "$WORKERS workers started; endpoints in $OUT/endpoints.json" >&2

"$BIN/trainstep" job watch "$JOB"
RESULT=$?
"$BIN/trainstep" job logs "$JOB" -o jsonl >"$OUT/updates.jsonl.tmp" && mv "$OUT/updates.jsonl.tmp" "$OUT/updates.jsonl"
echo "per-update log: $OUT/updates.jsonl ($(wc -l <"$OUT/updates.jsonl") windows)" >&2
exit $RESULT
