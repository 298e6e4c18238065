#!/usr/bin/env bash
# `make demo`: trains tiny_gpt on the license texts every Debian machine has
# (/usr/share/common-licenses) with 2 workers, accumulation 4, warmup-cosine and clipping;
# then prints a summary and a sample of text from the final checkpoint.
#
# Precision: bf16 where the CPU computes it natively (avx512_bf16 / amx_bf16), fp32 elsewhere:
# there LibTorch emulates bf16 autocast, tens of times slower than fp32. The worker
# binary decides (`trainstep-worker --host-info`, given the same --worker-flag flags as the
# demo's workers); TRAINSTEP_DEMO_PRECISION=fp32|bf16 overrides it.
#   deploy/local/demo.sh [--dry-run] [launch.sh flags...]
#   --dry-run   print the precision and why, write demo-out/demo-spec.json, and stop
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${DEMO_OUT:-demo-out}
BIN=${BIN:-build/bin}
TEMPLATE=deploy/local/demo-spec.json
SPEC=$OUT/demo-spec.json

DRY_RUN=0 LAUNCH_ARGS=() WORKER_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --worker-flag) LAUNCH_ARGS+=("$1" "${2:-}"); WORKER_FLAGS+=("${2:-}"); shift ;;
    --worker-flag=*) LAUNCH_ARGS+=("$1"); WORKER_FLAGS+=("${1#--worker-flag=}") ;;
    *) LAUNCH_ARGS+=("$1") ;;
  esac
  shift
done
[ -x "$BIN/trainstep-worker" ] || { echo "demo: $BIN/trainstep-worker not found: run \`make build\` first" >&2; exit 2; }

HOST=$("$BIN/trainstep-worker" --host-info ${WORKER_FLAGS[@]+"${WORKER_FLAGS[@]}"}) || exit 2
json() { sed -n "s/.*\"$1\": *\(\"[^\"]*\"\|[^,}]*\).*/\1/p" <<<"$HOST" | tr -d '"'; }
BF16_FLAGS=$(sed -n 's/.*"native_bf16_flags": \[\([^]]*\)\].*/\1/p' <<<"$HOST" | tr -d '"')
case "${TRAINSTEP_DEMO_PRECISION:-}" in
  fp32 | bf16) PRECISION=$TRAINSTEP_DEMO_PRECISION WHY="set by TRAINSTEP_DEMO_PRECISION" ;;
  "")
    if [ "$(json native_bf16)" = true ]; then
      PRECISION=bf16 WHY="this CPU has native bf16 ($BF16_FLAGS)"
    else
      PRECISION=fp32 WHY="this CPU ($(json cpu_model)) has no native bf16 (no avx512_bf16 or amx_bf16): bf16 would be emulated, tens of times slower than fp32"
    fi
    ;;
  *) echo "demo: TRAINSTEP_DEMO_PRECISION must be fp32 or bf16, got '$TRAINSTEP_DEMO_PRECISION'" >&2; exit 2 ;;
esac

rm -rf "$OUT"
mkdir -p "$OUT"
sed -e "s/\"precision\": *\"[a-z0-9]*\"/\"precision\": \"$PRECISION\"/" \
  -e "s|\"demo-out/|\"$OUT/|" "$TEMPLATE" >"$SPEC"
echo "trainstep demo: tiny_gpt on /usr/share/common-licenses, 2 workers, K=4 (spec: $SPEC)" >&2
echo "precision $PRECISION: $WHY" >&2
echo "blas: $(json blas) $(json blas_path)" >&2
[ $DRY_RUN -eq 1 ] && exit 0
deploy/local/launch.sh --spec "$SPEC" --out "$OUT" --bin "$BIN" ${LAUNCH_ARGS[@]+"${LAUNCH_ARGS[@]}"}
RESULT=$?

field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
LOG="$OUT/updates.jsonl"
if [ ! -s "$LOG" ]; then
  echo "demo: no per-update log was written (exit $RESULT); logs are in $OUT/logs" >&2
  exit $RESULT
fi
COMMITS=$(grep -c '"outcome":"commit"' "$LOG")
SKIPS=$(grep -c '"outcome":"skip"' "$LOG")
ABORTS=$(grep -c '"outcome":"abort"' "$LOG")
FIRST_LOSS=$(grep '"outcome":"commit"' "$LOG" | head -1 | field loss)
LAST_LOSS=$(grep '"outcome":"commit"' "$LOG" | tail -1 | field loss)
TOKENS=$(tail -1 "$LOG" | field cumulative_tokens)
# Checkpoint ids, numerically (ckpt-10 after ckpt-9).
CKPT_IDS=$(ls -d "$OUT"/checkpoints/ckpt-* 2>/dev/null | sed 's/.*ckpt-//' | sort -n)
LATEST=""
[ -n "$CKPT_IDS" ] && LATEST="$OUT/checkpoints/ckpt-$(tail -1 <<<"$CKPT_IDS")"

echo
echo "================ trainstep demo summary ================"
printf "updates committed   %s (skipped %s, aborted %s)\n" "$COMMITS" "$SKIPS" "$ABORTS"
printf "precision           %s (%s)\n" "$PRECISION" "$WHY"
printf "tokens trained      %s\n" "$TOKENS"
printf "loss                %.3f -> %.3f (token-weighted, per window)\n" "$FIRST_LOSS" "$LAST_LOSS"
printf "per-update log      %s\n" "$LOG"
printf "checkpoints         %s\n" "$(for i in $CKPT_IDS; do printf '%s ' "$OUT/checkpoints/ckpt-$i"; done)"
printf "metrics (while up)  %s\n" "$(tr -d '\n' <"$OUT/endpoints.json")"
printf "logs                %s/logs/\n" "$OUT"
if [ -n "$LATEST" ]; then
  echo
  echo "---- text sampled from $LATEST ----"
  # One thread: a batch of one is too small to split, and a second OpenMP thread only waits
  # (40 s instead of 4 for these 240 bytes on 2 busy cores).
  "$BIN/trainstep-worker" --generate --checkpoint "$LATEST" --threads 1 \
    --prompt "This program is free software; you can " --tokens 240 --temperature 0.7
  echo "-----------------------------------------"
fi
exit $RESULT
