#!/usr/bin/env bash
# Installs every Debian package trainstep needs to build, test and run the demo, and points
# libblas.so.3 / liblapack.so.3 at OpenBLAS.
# Idempotent: packages already present are skipped, so a warm machine pays nothing.
set -euo pipefail

# LibTorch does its fp32 GEMMs through whatever libblas.so.3 is. Debian's default is the
# reference BLAS, ~10x slower than OpenBLAS for the worker (BENCHMARKS.md, "BLAS"). Of
# OpenBLAS's two builds the OpenMP one serves it best: equal with one thread per worker, 2.7x
# faster with one worker on every core (the pthread build's own pool fights LibTorch's
# OpenMP pool). The pthread build is installed too: worker_blas_test starts workers on it.
OPENBLAS=openblas-openmp
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates curl
  libtorch-dev libgloo-dev libopenblas0-openmp libopenblas0-pthread
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  prometheus-cpp-dev prometheus
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format  # make check-format (CI)
  python3 python3-torch
  python3-yaml  # tests/deploy/k8s_pod_security.py reads the rendered manifests
  debootstrap  # the Debian 13 root of `make check-gpu-build`
  python3-grpcio python3-protobuf  # the Python client (client/python) and its tests
  openssl  # scripts/dev-certs.sh: the TLS/mTLS tests' certificates and the secured tour
  # Sanitizer and fuzzing builds (make check-asan, check-tsan, fuzz): clang 14, its sanitizer
  # and libFuzzer runtimes, and llvm-symbolizer for file:line in reports.
  clang-14 libclang-rt-14-dev llvm-14
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# kubectl only checks manifests; some images already carry it from another package
# (which conflicts with Debian's kubernetes-client), so take whichever is present.
command -v kubectl >/dev/null || missing+=(kubernetes-client)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Installing OpenBLAS switches the alternatives only where they are in auto mode. Switch them
# where they name the reference BLAS/LAPACK (Debian's slow default) or the pthread build
# (what this script chose before, and the auto choice when both builds are installed) too;
# an implementation the machine's owner chose (MKL, BLIS) is left as it is.
# libopenblas.so.0 too: the OpenMP build's libblas.so.3 is a thin wrapper that loads
# libopenblas.so.0 by that name, so without it the process would run the pthread build.
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  name="$lib-$MULTIARCH"
  want="/usr/lib/$MULTIARCH/$OPENBLAS/$lib"
  current=$(update-alternatives --query "$name" 2>/dev/null | sed -n 's/^Value: //p')
  case "$current" in
    "$want") ;;
    "" | "/usr/lib/$MULTIARCH/blas/$lib" | "/usr/lib/$MULTIARCH/lapack/$lib" | \
      "/usr/lib/$MULTIARCH/openblas-pthread/$lib")
      echo "install-deps: $lib -> $want"
      $SUDO update-alternatives --quiet --set "$name" "$want"
      ;;
    *) echo "install-deps: $lib stays $current (chosen on this machine)" ;;
  esac
done
