#!/usr/bin/env bash
# Builds cert-manager's controller (its Certificate, Issuer and ClusterIssuer controllers
# with the CA and self-signed issuers, started by tests/cert-manager/main.go) once from
# the Go module proxy into a cache outside the work tree keyed by version, next to
# cert-manager's CRDs from the same module, and prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="$(sed -n 's|^require github.com/cert-manager/cert-manager \(v[0-9.]*\)$|\1|p' tests/cert-manager/go.mod)"
[[ -n "$VERSION" ]] || { echo "cert-manager: no version in tests/cert-manager/go.mod" >&2; exit 1; }
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/cert-manager-$VERSION"
if [[ -x "$OUT/cert-manager-controller" && -s "$OUT/crds/cert-manager.io_certificates.yaml" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { echo "cert-manager: 'go' is not on PATH; it is needed to build cert-manager $VERSION" >&2; exit 1; }
echo "cert-manager: building cert-manager $VERSION into $OUT (once)" >&2
mkdir -p "$OUT/crds"
(cd tests/cert-manager && CGO_ENABLED=0 go build -mod=readonly -trimpath -buildvcs=false -ldflags "-s -w" -o "$OUT/cert-manager-controller.tmp" .) >&2
MODULE="$(cd tests/cert-manager && go list -mod=readonly -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"
cp "$MODULE"/deploy/crds/cert-manager.io_*.yaml "$OUT/crds/"
chmod u+w "$OUT"/crds/*.yaml
mv "$OUT/cert-manager-controller.tmp" "$OUT/cert-manager-controller"
echo "$OUT"
