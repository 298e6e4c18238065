#!/usr/bin/env bash
# `make demo`: trains tiny_gpt on the license texts every Debian machine has
# (/usr/share/common-licenses) with 2 workers, bf16, accumulation 4, warmup-cosine and
# clipping; then prints a summary and a sample of text from the final checkpoint.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=demo-out
BIN=${BIN:-build/bin}
SPEC=deploy/local/demo-spec.json

rm -rf "$OUT"
mkdir -p "$OUT"
echo "trainstep demo: tiny_gpt on /usr/share/common-licenses, 2 workers, bf16, K=4 (spec: $SPEC)" >&2
deploy/local/launch.sh --spec "$SPEC" --out "$OUT" --bin "$BIN" "$@"
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
printf "tokens trained      %s\n" "$TOKENS"
printf "loss                %.3f -> %.3f (token-weighted, per window)\n" "$FIRST_LOSS" "$LAST_LOSS"
printf "per-update log      %s\n" "$LOG"
printf "checkpoints         %s\n" "$(for i in $CKPT_IDS; do printf '%s ' "$OUT/checkpoints/ckpt-$i"; done)"
printf "metrics (while up)  %s\n" "$(tr -d '\n' <"$OUT/endpoints.json")"
printf "logs                %s/logs/\n" "$OUT"
if [ -n "$LATEST" ]; then
  echo
  echo "---- text sampled from $LATEST ----"
  "$BIN/trainstep-worker" --generate --checkpoint "$LATEST" \
    --prompt "This program is free software; you can " --tokens 240 --temperature 0.7
  echo "-----------------------------------------"
fi
exit $RESULT
