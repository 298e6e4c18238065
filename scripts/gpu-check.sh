#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and PyTorch, in ≤ 8 minutes,
#   1. builds trainstep against that PyTorch's LibTorch (torch.utils.cmake_prefix_path) with the
#      CUDA/NCCL path on; gRPC, protobuf, Abseil, prometheus-cpp, GoogleTest and Benchmark come
#      from the system when it has them, else from Debian .debs unpacked with `dpkg -x`;
#   2. runs the device tests (worker_device_test: every Cuda* test must run, not skip);
#   3. runs an fp16 job on the GPU against the single-process fp32 reference
#      (conformance: EquivalenceTest.CudaFp16WithScalerTracksFp32Reference), and the Llama-family
#      model's tests against the independent PyTorch implementation run by that PyTorch
#      (LlamaTest.*, among them one window on CUDA workers with activation checkpointing);
#   4. compares throughput with PyTorch DDP on the same GPU: a GPT-2-small-sized tiny_gpt
#      (12 layers, 12 heads, d_model 768, seq_len 1024) in bf16, tokens/s and MFU
#      (tests/bench/worker/gpu_bench.py).
# Results: OUT/gpu-check.txt (and the logs beside it).
#
#   scripts/gpu-check.sh --prepare-debs          here (Debian 12, with apt): fetch the .debs into
#                                                .gpu-debs/ for a machine that lacks the libraries
#   scripts/gpu-check.sh [--out DIR] [--debs DIR] [--python PY] [--cpu] [--force-debs]
#                        [--bench-windows N] [--skip-bench]
#
# --cpu rehearses everything but the device on a machine without a GPU: it builds against the
# Python's LibTorch (CUDA path as that LibTorch allows), runs the same tests (the device ones
# then skip and are reported as such, the fp16 job is not run) and the throughput comparison on
# the CPU with a small model. --force-debs uses the unpacked .debs even where the system has the
# libraries (to rehearse that path). Exits non-zero on any failure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="" DEBS="$ROOT/.gpu-debs" PY=python3 CPU=0 FORCE_DEBS=0 BENCH=1 BENCH_WINDOWS=""
DEB_PACKAGES=(libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev)

die() { echo "gpu-check: error: $*" >&2; exit 1; }
say() { echo "gpu-check: $*" | tee -a "$OUT/gpu-check.txt" >&2; }

prepare_debs() {
  # The packages and every library package they pull in; the base system (libc, libstdc++,
  # compilers) is left out: the GPU machine has its own.
  mkdir -p "$DEBS"
  local closure
  closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${DEB_PACKAGES[@]}" | grep -E '^[a-z0-9]' |
    grep -Ev '^(libc6|libc6-dev|libc-dev-bin|libgcc|libstdc\+\+|gcc|g\+\+|cpp|binutils|perl|dpkg|debconf|tar|zlib1g$|libzstd|liblzma|libbz2|libcrypt|linux-libc-dev|libselinux|libpcre|libgmp|libmpfr|libmpc|libisl|libtinfo|libncurses|libsystemd|libcap|libgcrypt|libgpg|liblz4|libudev)' |
    sort -u)
  # shellcheck disable=SC2086
  (cd "$DEBS" && apt-get download $closure >/dev/null)
  echo "gpu-check: $(ls "$DEBS"/*.deb | wc -l) .debs, $(du -sh "$DEBS" | cut -f1), in $DEBS" >&2
  exit 0
}

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare-debs) prepare_debs ;;
    --out) OUT=$2; shift 2 ;;
    --debs) DEBS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --force-debs) FORCE_DEBS=1; shift ;;
    --skip-bench) BENCH=0; shift ;;
    --bench-windows) BENCH_WINDOWS=$2; shift 2 ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
: >"$OUT/gpu-check.txt"
START=$(date +%s)
elapsed() { echo "$(($(date +%s) - START)) s"; }

# 1. PyTorch and its LibTorch.
read -r TORCH_VERSION TORCH_CMAKE CUDA_OK GPU_NAME < <("$PY" - <<'EOF'
import torch
name = torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "none"
print(torch.__version__, torch.utils.cmake_prefix_path, int(torch.cuda.is_available()), name)
EOF
) || die "$PY cannot import torch"
say "PyTorch $TORCH_VERSION ($PY), CUDA device: $GPU_NAME"
if [ "$CPU" = 0 ] && [ "$CUDA_OK" != 1 ]; then
  die "no CUDA device visible to PyTorch (use --cpu to rehearse without one)"
fi
TORCH_DIR=$(find "$TORCH_CMAKE" -name TorchConfig.cmake -printf '%h\n' 2>/dev/null | head -1 || true)
if [ -z "$TORCH_DIR" ] && [ "$CPU" = 1 ]; then
  # Debian's python3-torch keeps the CMake config with the system LibTorch instead.
  TORCH_DIR=$(find /usr/lib /usr/local/lib -name TorchConfig.cmake -printf '%h\n' 2>/dev/null |
    head -1 || true)
  say "no TorchConfig.cmake under $TORCH_CMAKE; rehearsing with $TORCH_DIR"
fi
[ -n "$TORCH_DIR" ] || die "no TorchConfig.cmake under $TORCH_CMAKE"

# 2. The service's libraries: the system's, or the carried .debs unpacked.
PREFIXES="$TORCH_DIR"
if [ "$FORCE_DEBS" = 1 ] || ! command -v grpc_cpp_plugin >/dev/null ||
  [ -z "$(find /usr/lib /usr/local/lib -name 'gRPCConfig.cmake' 2>/dev/null | head -1 || true)" ]; then
  ls "$DEBS"/*.deb >/dev/null 2>&1 || die "no gRPC here and no .debs in $DEBS (--prepare-debs)"
  DEPS="$OUT/deps"
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS"; done
  LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu"
  export PATH="$DEPS/usr/bin:$PATH" LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  PREFIXES="$PREFIXES;$DEPS/usr"
  DEB_ARGS=(-DProtobuf_INCLUDE_DIR="$DEPS/usr/include" -DProtobuf_LIBRARY="$LIBDIR/libprotobuf.so"
    -DProtobuf_PROTOC_EXECUTABLE="$DEPS/usr/bin/protoc")
  say "libraries from $(ls "$DEBS"/*.deb | wc -l) .debs unpacked in $DEPS"
else
  DEB_ARGS=()
  say "libraries from the system"
fi

# 3. Build what the checks run.
BUILD="$OUT/build"
CUDA_FLAG=ON
[ "$CUDA_OK" = 1 ] || CUDA_FLAG=OFF
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIXES" \
  -DTRAINSTEP_WITH_CUDA=$CUDA_FLAG ${DEB_ARGS[@]+"${DEB_ARGS[@]}"} >"$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log" >&2; die "configure failed (log: $OUT/configure.log)"; }
grep -E "gRPC_DIR|absl_DIR|Torch_DIR|prometheus-cpp_DIR" "$BUILD/CMakeCache.txt" |
  sed 's/^/  /' | tee -a "$OUT/gpu-check.txt" >&2
cmake --build "$BUILD" --target trainstep trainstep-coordinator trainstep-worker \
  worker_device_test conformance_equivalence_test conformance_llama_test >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" -m 20 "$OUT/build.log" >&2; die "build failed (log: $OUT/build.log)"; }
say "built in $(elapsed); worker loads: $(ldd "$BUILD/bin/trainstep-worker" |
  grep -oE 'lib(torch_cuda|nccl|torch_cpu|grpc\+\+|protobuf)[^ ]* => [^ ]*' | tr '\n' ' ')"

# 4. Device tests: on a GPU none of the Cuda* tests may skip.
rc=0
"$BUILD/tests/worker_device_test" >"$OUT/device-tests.log" 2>&1 || rc=$?
count() { grep -cE "$1" "$OUT/device-tests.log" || true; }
say "worker_device_test: $(count '^\[       OK \]') passed, $(count '^\[  FAILED  \] [A-Za-z].* \(')" \
  "failed, $(count '^\[  SKIPPED \] [A-Za-z].* \(') skipped"
grep -E '^\[  (FAILED  |SKIPPED) \] [A-Za-z].* \(' "$OUT/device-tests.log" | sed 's/^/  /' |
  tee -a "$OUT/gpu-check.txt" >&2 || true
[ $rc -eq 0 ] || die "device tests failed (log: $OUT/device-tests.log)"
if [ "$CPU" = 0 ] && grep -qE '^\[  SKIPPED \] .*Cuda' "$OUT/device-tests.log"; then
  die "a CUDA test skipped on a GPU machine (log: $OUT/device-tests.log)"
fi

# 5. The fp16 job against the single-process reference.
rc=0
(cd "$BUILD" && tests/conformance_equivalence_test \
  --gtest_filter='EquivalenceTest.CudaFp16WithScalerTracksFp32Reference:EquivalenceTest.Bf16*') \
  >"$OUT/fp16-job.log" 2>&1 || rc=$?
say "fp16 job: $(grep -E 'fp16 on|bf16 vs|^\[  (PASSED|FAILED|SKIPPED) \] [A-Za-z]' \
  "$OUT/fp16-job.log" | tr '\n' ' ')"
[ $rc -eq 0 ] || die "the fp16 job failed (log: $OUT/fp16-job.log)"
if [ "$CPU" = 0 ] && grep -q 'SKIPPED \] EquivalenceTest.CudaFp16' "$OUT/fp16-job.log"; then
  die "the fp16 job skipped on a GPU machine"
fi

# 5b. The Llama-family model against the independent implementation, on the device too.
rc=0
(cd "$BUILD" && TRAINSTEP_REFERENCE_PYTHON="$PY" tests/conformance_llama_test) \
  >"$OUT/llama.log" 2>&1 || rc=$?
say "llama: $(grep -cE '^\[       OK \]' "$OUT/llama.log") passed;" \
  "$(grep -E '^\[  (FAILED  |SKIPPED) \] [A-Za-z]' "$OUT/llama.log" | tr '\n' ' ')"
[ $rc -eq 0 ] || die "the Llama tests failed (log: $OUT/llama.log)"
if [ "$CPU" = 0 ] && grep -q 'SKIPPED \] LlamaTest.Cuda' "$OUT/llama.log"; then
  die "the CUDA Llama window skipped on a GPU machine"
fi

# 6. Throughput against PyTorch DDP on the same device.
if [ "$BENCH" = 1 ]; then
  BENCH_ARGS=(--python "$PY" --bin "$BUILD/bin" --out "$OUT/bench")
  if [ "$CPU" = 1 ]; then
    BENCH_ARGS+=(--device cpu --model "2,2,64,64" --micro-batch-size 4 --windows "${BENCH_WINDOWS:-12}")
  else
    BENCH_ARGS+=(--device cuda --windows "${BENCH_WINDOWS:-30}")
  fi
  "$PY" "$ROOT/tests/bench/worker/gpu_bench.py" "${BENCH_ARGS[@]}" 2>&1 |
    tee "$OUT/bench.log" | grep -E '^(trainstep|ddp|ratio|model|peak)' | tee -a "$OUT/gpu-check.txt" >&2 ||
    die "throughput comparison failed (log: $OUT/bench.log)"
fi
say "done in $(elapsed)$([ "$CPU" = 1 ] && echo ' (CPU rehearsal: no device was used)')"
