#!/usr/bin/env bash
# `make check-gpu-build`: the CUDA worker built and tested against Debian 13's LibTorch 2.6
# (CUDA 12.4 build) and NCCL, in the cached build root of scripts/debian13-root.sh.
#
# In the root: configure build-debian13/ with TRAINSTEP_WITH_CUDA=ON, build everything
# (ccache: its directory is on the host, so a second run compiles little), print the worker's
# `ldd` lines for libtorch_cuda and libnccl (and fail without them), run the whole test suite
# with ctest (CPU execution: tests that need a GPU skip, saying so) and list the skipped ones
# with their reasons. No GPU is needed. Times each phase. Each test binary runs as one CTest
# test (TRAINSTEP_TEST_PER_BINARY): loading LibTorch for CUDA costs ~5 s a process.
#
#   scripts/check-gpu-build.sh [CTEST_ARGS...]    e.g. -R worker_device to run a subset
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${GPU_BUILD_DIR:-build-debian13}

if [ "${TRAINSTEP_IN_DEBIAN13_ROOT:-}" != 1 ]; then
  t0=$(date +%s)
  scripts/debian13-root.sh ensure >/dev/null
  t1=$(date +%s)
  echo "check-gpu-build: Debian 13 root ready in $((t1 - t0)) s" >&2
  GPU_BUILD_DIR=$BUILD_DIR exec scripts/debian13-root.sh run env GPU_BUILD_DIR="$BUILD_DIR" \
    JOBS="${JOBS:-$(nproc)}" scripts/check-gpu-build.sh "$@"
fi

# From here on: inside the root.
JOBS=${JOBS:-$(nproc)}
phase() { echo "check-gpu-build: $*" >&2; }
t0=$(date +%s)
ccache --zero-stats >/dev/null 2>&1 || true
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINSTEP_BUILD_WORKER=ON \
  -DTRAINSTEP_WITH_CUDA=ON -DTRAINSTEP_TEST_PER_BINARY=ON >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log" >&2; exit 1; }
grep -q "trainstep: CUDA/NCCL worker path ON" "$BUILD_DIR.configure.log" ||
  { cat "$BUILD_DIR.configure.log" >&2; phase "the CUDA path is not enabled"; exit 1; }
rm -f "$BUILD_DIR.configure.log"
t1=$(date +%s)
phase "configured in $((t1 - t0)) s: $(dpkg-query -W -f='${Package} ${Version}, ' \
  libtorch-cuda-dev libnccl-dev nvidia-cuda-toolkit 2>/dev/null)"
cmake --build "$BUILD_DIR" -j "$JOBS"
t2=$(date +%s)
phase "built in $((t2 - t1)) s; ccache: $(ccache --print-stats 2>/dev/null |
  awk -F'\t' '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
              $1 == "cache_miss" { m = $2 } END { printf "%d hits, %d misses", h, m }')"

# Proof that the GPU path is linked: the worker loads LibTorch's CUDA library and NCCL.
phase "ldd $BUILD_DIR/bin/trainstep-worker:"
lines=$(ldd "$BUILD_DIR/bin/trainstep-worker" | grep -E 'libtorch_cuda|libnccl' || true)
echo "$lines"
for lib in libtorch_cuda libnccl; do
  grep -q "$lib.*=> /" <<<"$lines" || { phase "the worker does not load $lib"; exit 1; }
done

rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 600 "$@" || rc=$?
t3=$(date +%s)
phase "tests ran in $((t3 - t2)) s"
# What skipped and why: ctest shows "Skipped" without the reason GTEST_SKIP gave.
log="$BUILD_DIR/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 }
       /^\[ RUN      \] / { name = $4 }
       /: Skipped$/ { getline reason; sub(/[ \t\r]+$/, "", reason)
                      if (name != "") printf "  skipped %s: %s\n", name, reason }
       /^skipped: / { if (name != "") printf "  skipped %s: %s\n", name, substr($0, 10) }
      ' "$log" | sort -u >&2
fi
exit $rc
