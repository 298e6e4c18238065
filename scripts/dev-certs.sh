#!/usr/bin/env bash
# Development certificates for trainstep's TLS and mTLS, made with openssl:
#
#   scripts/dev-certs.sh [--days N] [--san DNS:name|IP:addr]... OUT_DIR
#
# OUT_DIR/ca.crt, ca.key          the CA (made once; kept when OUT_DIR already has one)
# OUT_DIR/coordinator.{crt,key}   server certificate: localhost, 127.0.0.1 and the Kubernetes
#                                 Service's names (trainstep-coordinator[.trainstep[.svc[...]]])
#                                 plus every --san
# OUT_DIR/worker.{crt,key}        client certificate, SAN DNS:trainstep-worker
# OUT_DIR/client.{crt,key}        client certificate, SAN DNS:trainstep-client (the CLI)
# OUT_DIR/auth-certs.txt          a --auth-certs file: the worker is a worker, the client admin
#
# Running it again over the same OUT_DIR issues new leaf certificates from the same CA, each
# file replaced by a rename: that is a rotation, which a running coordinator and its workers
# pick up without a restart. Keys are ECDSA P-256. For development and tests only: in a
# cluster, cert-manager issues them (deploy/k8s/certificates.yaml).
set -euo pipefail

days=30
extra_sans=()
while [ $# -gt 1 ]; do
  case "$1" in
    --days) days=$2; shift 2 ;;
    --san) extra_sans+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--days N] [--san DNS:name|IP:addr]... OUT_DIR" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] && [ "${1:0:1}" != "-" ] ||
  { echo "usage: $0 [--days N] [--san DNS:name|IP:addr]... OUT_DIR" >&2; exit 2; }
out=$1
command -v openssl >/dev/null || { echo "$0: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d "$out/.dev-certs.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -s "$out/ca.crt" ] || [ ! -s "$out/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$((days * 4))" \
    -subj "/CN=trainstep dev CA" -keyout "$work/ca.key" -out "$work/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>"$work/openssl.log" || { cat "$work/openssl.log" >&2; exit 1; }
  chmod 600 "$work/ca.key"
  mv "$work/ca.key" "$out/ca.key"
  mv "$work/ca.crt" "$out/ca.crt"
fi

# leaf NAME CN USAGE SAN...: NAME.key and NAME.crt, signed by the CA, renamed into place.
leaf() {
  local name=$1 cn=$2 usage=$3
  shift 3
  local sans
  sans=$(IFS=,; echo "$*")
  cat >"$work/$name.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=$usage
subjectAltName=$sans
EOF
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
    -keyout "$work/$name.key" -out "$work/$name.csr" 2>"$work/openssl.log" ||
    { cat "$work/openssl.log" >&2; exit 1; }
  openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$work/$name.ext" \
    -out "$work/$name.crt" 2>"$work/openssl.log" || { cat "$work/openssl.log" >&2; exit 1; }
  chmod 600 "$work/$name.key"
  chmod 644 "$work/$name.crt"
  mv "$work/$name.key" "$out/$name.key"
  mv "$work/$name.crt" "$out/$name.crt"
}

leaf coordinator trainstep-coordinator serverAuth \
  DNS:localhost IP:127.0.0.1 DNS:trainstep-coordinator DNS:trainstep-coordinator.trainstep \
  DNS:trainstep-coordinator.trainstep.svc DNS:trainstep-coordinator.trainstep.svc.cluster.local \
  ${extra_sans[@]+"${extra_sans[@]}"}
leaf worker trainstep-worker clientAuth DNS:trainstep-worker
leaf client trainstep-client clientAuth DNS:trainstep-client

if [ ! -e "$out/auth-certs.txt" ]; then
  cat >"$out/auth-certs.txt" <<'EOF'
# --auth-certs: one "SAN ROLE[,ROLE...]" per line. Roles: viewer, submitter, admin, worker
# (worker:JOB limits a worker to one job).
DNS:trainstep-worker worker
DNS:trainstep-client admin
EOF
fi
echo "certificates in $out: ca.crt, coordinator.{crt,key}, worker.{crt,key}, client.{crt,key}"
