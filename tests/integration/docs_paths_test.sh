#!/usr/bin/env bash
# The documents name no machine-specific path: README.md, every other *.md of the checkout and
# examples/ say where things are relative to the checkout, or by file name.
# Catches: a path of the machine they were written on (/work/…, /root/…, /home/…) that a reader's
# clone does not have, as README.md once named the seed documents' folder.
set -euo pipefail
ROOT=$1
cd "$ROOT"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.md' 'examples/*')
else  # a tarball: every document outside build folders
  mapfile -t files < <(find . \( -name 'build*' -o -name .git \) -prune -o \
    \( -name '*.md' -o -path './examples/*' \) -type f -print)
fi
[ "${#files[@]}" -gt 0 ] || { echo "no documents found under $ROOT"; exit 1; }
if grep -nE '(^|[^A-Za-z0-9_.])/(work|root|home)/' "${files[@]}"; then
  echo "machine-specific paths above: name the file, or a path relative to the checkout"
  exit 1
fi
echo "${#files[@]} documents, no machine-specific path"
