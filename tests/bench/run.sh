#!/usr/bin/env bash
# Runs every benchmark (`make bench`): the coordinator's (step machine, loopback window round
# trip, the round with ranks as processes beside a Gloo scalar all-reduce), the token-file
# check (tokens_bench) and the worker's (trainstep W=2 vs a plain LibTorch loop vs PyTorch
# DDP), keeps their console output, and ends with one summary.
# Builds nothing: run `make build` first.
# BUILD_DIR (default build) picks the build; extra arguments go to the worker benchmark
# (tests/bench/worker/worker_bench.py --help). See BENCHMARKS.md.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-build}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
LOG_DIR=$(mktemp -d /tmp/trainstep-bench.XXXXXX)
SUMMARY=()
FAILED=0

header() { printf '\n===== %s =====\n' "$1"; }

# run_bench NAME LOG COMMAND...: runs it with its output shown and kept in LOG.
run_bench() {
  local name=$1 log=$2
  shift 2
  header "$name"
  local start=$SECONDS
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    SUMMARY+=("$name: FAILED (exit $rc); output in $log")
    FAILED=1
  else
    SUMMARY+=("$name: ok in $((SECONDS - start)) s")
  fi
  return "$rc"
}

printf 'trainstep benchmarks: %s, nproc %s, %s, load %s\n' "$(date -u +%FT%TZ)" "$(nproc)" \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" "$(cut -d' ' -f1-3 /proc/loadavg)"

for b in step_machine_bench loopback_bench tokens_bench; do
  if [ -x "$BUILD_DIR/bench/$b" ]; then
    if run_bench "$b" "$LOG_DIR/$b.log" "$BUILD_DIR/bench/$b"; then
      # Google Benchmark rows: name and user counters.
      while read -r line; do SUMMARY+=("  $line"); done < <(
        grep -E '^BM_' "$LOG_DIR/$b.log" | awk '{c=""; for (i=2; i<=NF; i++) if ($i ~ /=/) c=c" "$i; print $1 c}')
    fi
  else
    SUMMARY+=("$b: not built ($BUILD_DIR/bench/$b missing: run \`make build\`)")
    FAILED=1
  fi
done

# The window round trip with ranks as processes, beside a Gloo scalar all-reduce.
if [ -x "$BUILD_DIR/bench/coordination_rank" ]; then
  if run_bench coordination_bench "$LOG_DIR/coordination_bench.log" /usr/bin/python3 \
      "$ROOT/tests/bench/coordination_bench.py" --build-dir "$BUILD_DIR" --breakdown; then
    while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^\| [0-9]' "$LOG_DIR/coordination_bench.log" | head -3)
  fi
else
  SUMMARY+=("coordination_bench: not built ($BUILD_DIR/bench/coordination_rank missing: run \`make build\`)")
  FAILED=1
fi

if [ -x "$BUILD_DIR/bench/plain_loop_bench" ]; then
  if run_bench worker_bench "$LOG_DIR/worker_bench.log" /usr/bin/python3 \
      "$ROOT/tests/bench/worker/worker_bench.py" --build-dir "$BUILD_DIR" \
      --out-dir "$LOG_DIR/worker" "$@"; then
    while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^\| ' "$LOG_DIR/worker_bench.log")
  fi
else
  SUMMARY+=("worker_bench: skipped ($BUILD_DIR/bench/plain_loop_bench missing: the worker is built only with TRAINSTEP_BUILD_WORKER=ON)")
fi

header summary
printf '%s\n' "${SUMMARY[@]}"
echo "logs: $LOG_DIR"
exit "$FAILED"
