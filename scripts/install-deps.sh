#!/usr/bin/env bash
# Installs every Debian package trainstep needs to build, test and run the demo.
# Idempotent: packages already present are skipped, so a warm machine pays nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates curl
  libtorch-dev libgloo-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  prometheus-cpp-dev prometheus
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch
  debootstrap  # the Debian 13 root of `make check-gpu-build`
  python3-grpcio python3-protobuf  # the Python client (client/python) and its tests
)

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
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
