#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (YAML on stdin, as `kubectl kustomize` prints them) for
least privilege, and that every worker confines job paths.

Catches: a pod that mounts a service-account token it never uses (a job spec could name it), a
writable root filesystem, a capability kept, privilege escalation allowed; a worker started
without --allowed-roots, with / (every path: its own key included), or with a root outside
the data and checkpoint volumes, or none per owner (one tenant would read another's files).
Prints one line per finding and exits 1 if there is any.
"""
import shlex
import sys

import yaml

POD_KINDS = {"Job", "StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "CronJob"}


def pod_specs(doc):
    kind = doc.get("kind")
    if kind == "Pod":
        return [doc["spec"]]
    if kind == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if kind in POD_KINDS:
        return [doc["spec"]["template"]["spec"]]
    return []


def within(path, root):
    path, root = path.rstrip("/") or "/", root.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def allowed_roots(container):
    """The --allowed-roots value from the container's command line, or None."""
    words = []
    for part in (container.get("command") or []) + (container.get("args") or []):
        try:
            words += shlex.split(part)
        except ValueError:
            words += part.split()
    for i, w in enumerate(words):
        if w == "--allowed-roots" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--allowed-roots="):
            return w.split("=", 1)[1]
    return None


def is_worker(container):
    text = " ".join((container.get("command") or []) + (container.get("args") or []))
    return "trainstep-worker" in text


def check(docs):
    problems = []
    workers = 0
    for doc in docs:
        for spec in pod_specs(doc):
            name = f"{doc['kind']} {doc['metadata']['name']}"
            if spec.get("automountServiceAccountToken") is not False:
                problems.append(f"{name}: automountServiceAccountToken is not false")
            volumes = {v["name"]: v for v in spec.get("volumes") or []}
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                where = f"{name}, container {c['name']}"
                sc = c.get("securityContext") or {}
                if sc.get("readOnlyRootFilesystem") is not True:
                    problems.append(f"{where}: readOnlyRootFilesystem is not true")
                if sc.get("allowPrivilegeEscalation") is not False:
                    problems.append(f"{where}: allowPrivilegeEscalation is not false")
                if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                    problems.append(f"{where}: capabilities do not drop ALL")
                if not is_worker(c):
                    continue
                workers += 1
                roots = allowed_roots(c)
                if not roots:
                    problems.append(f"{where}: the worker runs without --allowed-roots")
                    continue
                mounts = c.get("volumeMounts") or []
                claims = [m["mountPath"] for m in mounts
                          if "persistentVolumeClaim" in volumes.get(m["name"], {})]
                secrets = [m["mountPath"] for m in mounts
                           if "secret" in volumes.get(m["name"], {})]
                parts = [r.strip() for r in roots.split(",") if r.strip()]
                for root in parts:
                    if not any(within(root, claim) for claim in claims):
                        problems.append(f"{where}: --allowed-roots {root} is outside the data "
                                        f"and checkpoint volumes {claims}")
                    for secret in secrets:
                        if within(secret, root) or within(root, secret):
                            problems.append(f"{where}: --allowed-roots {root} reaches the "
                                            f"secret volume at {secret}")
                if not any("{owner}" in r for r in parts):
                    problems.append(f"{where}: no --allowed-roots root is per owner ({{owner}})")
    if workers == 0:
        problems.append("no worker container found")
    return problems


def main():
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    problems = check(docs)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"ok: least privilege and confined job paths in {len(docs)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
