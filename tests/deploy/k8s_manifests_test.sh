#!/usr/bin/env bash
# The Kubernetes manifests render (kustomize, offline) into the objects the README promises:
# deploy/k8s, and the GPU overlay deploy/k8s-gpu on top of it.
# Catches: YAML that does not parse, a missing object, a kustomization pointing at nothing,
# GPU workers without a GPU each, without NCCL's environment or on the CPU image; a
# coordinator served plaintext (--insecure) or probed on its mTLS port, a pod without the
# certificate Secret it needs, a Secret that certificates.yaml does not make, a coordinator
# certificate that does not name the address the workers dial; a pod with more privilege than it
# needs, a worker whose job paths are not confined (k8s_pod_security.py).
# Exits 77 (skipped) without kubectl: the Debian 13 root of `make check-gpu-build` has none.
set -euo pipefail
ROOT=$1
command -v kubectl >/dev/null || { echo "skipped: kubectl is not installed"; exit 77; }
out=$(kubectl kustomize "$ROOT/deploy/k8s")
for kind in Namespace StatefulSet Service PodDisruptionBudget Job ConfigMap; do
  grep -q "^kind: $kind$" <<<"$out" || { echo "missing kind $kind"; exit 1; }
done
grep -q "completionMode: Indexed" <<<"$out" || { echo "workers are not an Indexed Job"; exit 1; }
grep -q "maxUnavailable: 0" <<<"$out" || { echo "no PodDisruptionBudget maxUnavailable 0"; exit 1; }
! grep -q -- "--insecure" <<<"$out" || { echo "the coordinator is served plaintext (--insecure)"; exit 1; }
for flag in --tls-cert= --tls-key= --tls-client-ca= --auth-certs= --health-listen=0.0.0.0:7071; do
  grep -q -- "- $flag" <<<"$out" || { echo "the coordinator lacks $flag"; exit 1; }
done
probes=$(grep -A1 ' grpc:$' <<<"$out" | grep 'port:')
[ "$(grep -c 'port: 7071$' <<<"$probes")" -eq 2 ] && ! grep -q 'port: 7070$' <<<"$probes" ||
  { echo "the probes must use the plaintext health port 7071, not the mTLS port"; exit 1; }
for secret in trainstep-coordinator-tls trainstep-worker-tls trainstep-client-tls; do
  grep -q "secretName: $secret$" <<<"$out" || { echo "no pod mounts the Secret $secret"; exit 1; }
  grep -q "secretName: $secret$" "$ROOT/deploy/k8s/certificates.yaml" ||
    { echo "certificates.yaml makes no Secret $secret"; exit 1; }
done
[ "$(grep -c 'name: TRAINSTEP_TLS_CERT$' <<<"$out")" -eq 2 ] ||
  { echo "the workers and the submit job must present client certificates"; exit 1; }
grep -q "value: trainstep-coordinator:7070" <<<"$out" &&
  grep -q "^    - trainstep-coordinator$" "$ROOT/deploy/k8s/certificates.yaml" ||
  { echo "the coordinator's certificate must name trainstep-coordinator, the workers' address"; exit 1; }
grep -q "name: trainstep-auth$" <<<"$out" || { echo "no --auth-certs ConfigMap"; exit 1; }
grep -q "resource: requests.cpu" <<<"$out" && grep -q -- '--threads "${CPU_REQUEST}"' <<<"$out" ||
  { echo "workers do not size their threads from their CPU request"; exit 1; }
echo "ok: $(grep -c '^kind:' <<<"$out") objects"
# Least privilege and confined job paths (k8s_pod_security.py says what each check catches),
# and the checker itself refuses a worker without roots, with /, and a mounted token.
security="python3 $ROOT/tests/deploy/k8s_pod_security.py"
$security <<<"$out"
! sed '/--allowed-roots/d' <<<"$out" | $security >/dev/null ||
  { echo "the pod check passed a worker without --allowed-roots"; exit 1; }
! sed 's#--allowed-roots "[^"]*"#--allowed-roots /#' <<<"$out" | $security >/dev/null ||
  { echo "the pod check passed a worker with --allowed-roots /"; exit 1; }
! sed '/automountServiceAccountToken/d' <<<"$out" | $security >/dev/null ||
  { echo "the pod check passed a pod with its service-account token mounted"; exit 1; }

# The GPU overlay: the same objects; the worker Job (and only it) changed.
gpu=$(kubectl kustomize "$ROOT/deploy/k8s-gpu" 2>/dev/null)
[ "$(grep -c '^kind:' <<<"$gpu")" -eq "$(grep -c '^kind:' <<<"$out")" ] ||
  { echo "the GPU overlay changes the set of objects"; exit 1; }
# The worker Job: from its "kind: Job" line with name trainstep-workers to the next object.
workers=$(awk '/^---$/ { if (doc ~ /\nkind: Job\n/ && doc ~ /\n  name: trainstep-workers\n/) print doc; doc = "" ; next }
               { doc = doc "\n" $0 }
               END { if (doc ~ /\nkind: Job\n/ && doc ~ /\n  name: trainstep-workers\n/) print doc }' <<<"$gpu")
[ -n "$workers" ] || { echo "no worker Job in the GPU overlay"; exit 1; }
need() { grep -q -- "$1" <<<"$workers" || { echo "GPU worker Job: $2"; exit 1; }; }
need "completionMode: Indexed" "not an Indexed Job"
need "image: trainstep-gpu:" "not the GPU image (deploy/docker/Dockerfile.gpu)"
[ "$(grep -c 'nvidia.com/gpu: 1$' <<<"$workers")" -eq 2 ] ||
  { echo "GPU worker Job: not exactly one GPU per worker (request and limit)"; exit 1; }
need "--device cuda" "the worker is not told to use its GPU"
need "name: NCCL_SOCKET_IFNAME" "no NCCL environment"
need "mountPath: /dev/shm" "no shared memory for NCCL"
need "name: TRAINSTEP_COORDINATOR" "lost the base's environment"
need "name: TRAINSTEP_TLS_CERT" "lost the base's client certificate"
need "secretName: trainstep-worker-tls" "lost the base's certificate Secret"
need "claimName: trainstep-checkpoints" "lost the base's volumes"
$security <<<"$gpu"
[ "$(grep -c 'image: trainstep:' <<<"$gpu")" -eq 2 ] ||
  { echo "the coordinator and the submit job should keep the CPU image"; exit 1; }
echo "ok: GPU overlay, $(grep -c '^kind:' <<<"$gpu") objects"
