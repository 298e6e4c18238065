#!/usr/bin/env bash
# The Kubernetes manifests render (kustomize, offline) into the objects the README promises.
# Catches: YAML that does not parse, a missing object, a kustomization pointing at nothing.
set -euo pipefail
ROOT=$1
out=$(kubectl kustomize "$ROOT/deploy/k8s")
for kind in Namespace StatefulSet Service PodDisruptionBudget Job ConfigMap; do
  grep -q "^kind: $kind$" <<<"$out" || { echo "missing kind $kind"; exit 1; }
done
grep -q "completionMode: Indexed" <<<"$out" || { echo "workers are not an Indexed Job"; exit 1; }
grep -q "maxUnavailable: 0" <<<"$out" || { echo "no PodDisruptionBudget maxUnavailable 0"; exit 1; }
grep -q -- "--insecure" <<<"$out" || { echo "coordinator on 0.0.0.0 needs --insecure"; exit 1; }
echo "ok: $(grep -c '^kind:' <<<"$out") objects"
