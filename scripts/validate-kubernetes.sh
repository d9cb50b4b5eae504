#!/usr/bin/env bash
# Validates deploy/kubernetes/*.yaml offline and strictly (an unknown or misspelt field is an
# error, and so is a kind or apiVersion without a schema) with the PyPI package
# kubernetes-validate, which ships Kubernetes' schemas: against the oldest and the newest
# version it knows unless KUBERNETES_VERSIONS says otherwise. kustomization.yaml is not a
# resource and is skipped; monitoring/ (Prometheus Operator CRDs, which have no schema there) is
# only parsed. The tool goes into a virtualenv under ~/.cache, installed once (idempotent).
# tests/deploy_files.rs checks what schemas cannot: the ConfigMap's leafd.toml, ports, paths.
#   scripts/validate-kubernetes.sh
set -euo pipefail
cd "$(dirname "$0")/.."

tool_version=${KUBERNETES_VALIDATE_VERSION:-1.37.0}
kube_versions=${KUBERNETES_VERSIONS:-1.25.0 1.37.0}
venv=${KUBERNETES_VALIDATE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/leafd/kubernetes-validate-$tool_version}

if [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$tool_version" ]; then
  python3 -m venv "$venv" || {
    echo "cannot create a virtualenv: install python3-venv (apt-get install python3-venv)" >&2
    exit 1
  }
  "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$tool_version"
fi

manifests=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
[ "${#manifests[@]}" -gt 0 ] || { echo "no manifests in deploy/kubernetes/" >&2; exit 1; }

k_args=()
for v in $kube_versions; do k_args+=(-k "$v"); done

status=0
output=$("$venv/bin/kubernetes-validate" --strict "${k_args[@]}" "${manifests[@]}") || status=$?
echo "$output"
# kubernetes-validate exits 0 on WARN (no schema for that kind/apiVersion): a typo there must
# fail too.
if [ "$status" -ne 0 ] || grep -qv '^INFO ' <<<"$output"; then
  echo "FAILED: deploy/kubernetes/ does not validate (see above)" >&2
  exit 1
fi

"$venv/bin/python" - deploy/kubernetes/monitoring/*.yaml <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc and "kind" not in doc:
            sys.exit(f"{path}: a document without kind")
    print(f"INFO {path} parsed (CRD or kustomization: no schema check)")
PY
echo "OK: ${#manifests[@]} manifests valid against Kubernetes $kube_versions (strict)"
