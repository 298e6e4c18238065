#!/usr/bin/env bash
# Runs every libFuzzer target of a TRAINSTEP_FUZZ build for SECONDS each, JOBS at a time
# (make fuzz; CI runs it with 60 s). Each target starts from its committed seeds
# (tests/fuzz/corpus/<target>/, never written to) plus what earlier runs found
# (fuzz-out/<target>/corpus/, kept between runs); <target>.dict is used when present.
# A crash, leak, sanitizer report, timeout or out-of-memory fails the run and names the input
# that caused it (fuzz-out/<target>/crash-*); to keep it as a regression test, copy it into
# tests/fuzz/corpus/<target>/ (ctest fuzz_corpus_<target> replays it in every build).
# FUZZ_SEED=N fixes libFuzzer's seed (CI's); the same binary with the same seed and inputs
# explores the same way, but another build (another path, compiler, library) explores
# otherwise, so a failure is reproduced from its input, which a failure prints in base64.
# Unset, every run explores anew.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS] [JOBS]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${1:?usage: run.sh BUILD_DIR [SECONDS] [JOBS]}
SECONDS_EACH=${2:-300}
JOBS=${3:-2}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
OUT=${FUZZ_OUT:-$ROOT/fuzz-out}
# Leaks count; an abort (a failed invariant) or any sanitizer report is a crash.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mapfile -t TARGETS < <(cd "$BUILD_DIR/fuzz" 2>/dev/null && ls -- *_fuzz 2>/dev/null | sed 's/_fuzz$//')
if [ ${#TARGETS[@]} -eq 0 ]; then
  echo "fuzz: no *_fuzz binaries in $BUILD_DIR/fuzz (configure with -DTRAINSTEP_FUZZ=ON)" >&2
  exit 2
fi

run_one() {
  local t=$1 dir="$OUT/$1"
  mkdir -p "$dir/corpus"
  local dict=() seed=()
  [ -f "$ROOT/tests/fuzz/$t.dict" ] && dict=(-dict="$ROOT/tests/fuzz/$t.dict")
  [ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")
  "$BUILD_DIR/fuzz/${t}_fuzz" "$dir/corpus" "$ROOT/tests/fuzz/corpus/$t" "${dict[@]}" "${seed[@]}" \
    -max_total_time="$SECONDS_EACH" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/" >"$dir/log" 2>&1
  echo $? >"$dir/rc"
}
export -f run_one
export BUILD_DIR OUT ROOT SECONDS_EACH FUZZ_SEED

echo "fuzz: ${#TARGETS[@]} targets × ${SECONDS_EACH} s, ${JOBS} at a time; logs in $OUT/<target>/log"
rm -f "$OUT"/*/rc "$OUT"/*/crash-* "$OUT"/*/leak-* "$OUT"/*/timeout-* "$OUT"/*/oom-* 2>/dev/null
printf '%s\n' "${TARGETS[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one {}'

failed=0
for t in "${TARGETS[@]}"; do
  dir="$OUT/$t"
  rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1)
  if [ "$rc" = 0 ]; then
    echo "fuzz: $t: ok, ${runs:-?} runs, ${cov:-cov: ?}, corpus $(ls "$dir/corpus" | wc -l) new inputs"
  else
    failed=$((failed + 1))
    input=$(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null | head -1)
    echo "fuzz: $t: FAILED (exit $rc) after ${runs:-?} runs; input: ${input:-none written}"
    grep -E -A 30 'ERROR: |invariant failed|runtime error|deadly signal' "$dir/log" | head -50
    # The input itself, so that a failure seen only in a log (CI's) can be replayed anywhere:
    #   base64 -d > x <<< '...'; BUILD_DIR/fuzz/<target>_fuzz x
    if [ -n "$input" ] && [ "$(stat -c %s "$input")" -le 65536 ]; then
      echo "fuzz: $t: the input, base64: $(base64 -w0 "$input")"
    fi
  fi
done
echo "fuzz: $((${#TARGETS[@]} - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
