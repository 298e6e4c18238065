#!/usr/bin/env bash
# deploy/local/demo.sh chooses bf16 only where the worker reports native bf16, says why, and
# writes that precision into the spec it runs. Catches: the demo asking for bf16 on a CPU
# that emulates it (~57 minutes instead of ~3), a choice made without a reason.
set -uo pipefail
ROOT=$1 BIN=$2
DIR=$(mktemp -d /tmp/trainstep-demo-precision.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; cat "$DIR/err" 2>/dev/null; exit 1; }
printf 'processor\t: 0\nmodel name\t: AVX2 CPU\nflags\t\t: avx2 fma\n' >"$DIR/avx2"
printf 'processor\t: 0\nmodel name\t: BF16 CPU\nflags\t\t: avx2 avx512f avx512_bf16\n' >"$DIR/bf16"
# --debug-cpuinfo is a test hook: the testing build of the worker takes it.
demo() { BIN=$BIN/testing DEMO_OUT=$DIR/out "$ROOT/deploy/local/demo.sh" --dry-run "$@" 2>"$DIR/err"; }

demo --worker-flag=--debug-cpuinfo="$DIR/avx2" || fail "dry run exited $?"
grep -q 'precision fp32: this CPU (AVX2 CPU) has no native bf16' "$DIR/err" || fail "no fp32 choice with its reason"
grep -q '"precision": "fp32"' "$DIR/out/demo-spec.json" || fail "the spec does not say fp32"
grep -q "\"$DIR/out/checkpoints\"" "$DIR/out/demo-spec.json" || fail "checkpoints not under the demo's output"

demo --worker-flag --debug-cpuinfo="$DIR/bf16" || fail "dry run exited $?"
grep -q 'precision bf16: this CPU has native bf16 (avx512_bf16)' "$DIR/err" || fail "no bf16 choice with its reason"
grep -q '"precision": "bf16"' "$DIR/out/demo-spec.json" || fail "the spec does not say bf16"

TRAINSTEP_DEMO_PRECISION=bf16 demo --worker-flag=--debug-cpuinfo="$DIR/avx2" || fail "override exited $?"
grep -q 'precision bf16: set by TRAINSTEP_DEMO_PRECISION' "$DIR/err" || fail "the override is not honoured"
TRAINSTEP_DEMO_PRECISION=fp64 demo
[ $? -eq 2 ] || fail "a bad TRAINSTEP_DEMO_PRECISION must exit 2"
echo ok
