#!/usr/bin/env bash
# Rewrites the committed seed corpora (tests/fuzz/corpus/<target>/) from real files: the specs
# in deploy/, and what trainstep_fuzz_seeds writes with the project's own writers (journal,
# step-machine programs, meta.json, safetensors) around examples/make_jsonl.py's JSONL and this
# repository's README as text. Needs a worker build: BUILD_DIR (default build).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-build}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
cmake --build "$BUILD_DIR" --target trainstep_fuzz_seeds
CORPUS="$ROOT/tests/fuzz/corpus"
TMP=$(mktemp -d /tmp/trainstep-seeds.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
python3 "$ROOT/examples/make_jsonl.py" "$TMP/train.jsonl" --samples 6
head -c 1500 "$ROOT/README.md" > "$TMP/text.txt"
"$BUILD_DIR/fuzz/trainstep_fuzz_seeds" "$CORPUS" "$TMP/train.jsonl" "$TMP/text.txt"
cp "$ROOT/deploy/local/demo-spec.json" "$CORPUS/spec/demo-spec.json"
cp "$ROOT/deploy/k8s/job.json" "$CORPUS/spec/k8s-job.json"
cp "$ROOT/tests/unit/worker/checkpoint/reference.safetensors" \
  "$CORPUS/safetensors/reference_python_writer.safetensors"
echo "seed corpora in $CORPUS:"
for d in "$CORPUS"/*/; do echo "  $(basename "$d"): $(ls "$d" | wc -l) files, $(du -sh "$d" | cut -f1)"; done
