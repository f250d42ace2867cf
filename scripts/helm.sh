#!/usr/bin/env bash
# Builds helm once from the Go module proxy into a cache outside the work tree keyed
# by version, and prints its path. Honours a helm already on PATH at that version.
set -euo pipefail
HELM_VERSION="${PLUGDB_HELM_VERSION:-3.22.0}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/helm-v$HELM_VERSION"
if command -v helm >/dev/null && helm version --template '{{.Version}}' 2>/dev/null | grep -qx "v$HELM_VERSION"; then
  command -v helm
  exit 0
fi
if [[ -x "$OUT/helm" ]]; then
  echo "$OUT/helm"
  exit 0
fi
command -v go >/dev/null || { echo "helm: 'go' is not on PATH; it is needed to build helm $HELM_VERSION" >&2; exit 1; }
echo "helm: building helm v$HELM_VERSION into $OUT (once)" >&2
mkdir -p "$OUT"
GOBIN="$OUT" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go install -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >&2
[[ -x "$OUT/helm" ]] || { echo "helm: build finished but $OUT/helm is missing" >&2; exit 1; }
echo "$OUT/helm"
