#!/usr/bin/env bash
# Generates the Prometheus Operator's CRDs (PodMonitor, ServiceMonitor, PrometheusRule
# and the rest) from its API types, as its project does: controller-gen over the
# `monitoring.coreos.com/v1` package of github.com/prometheus-operator/prometheus-operator,
# both from the Go module proxy at exact versions. Once, into a cache outside the work
# tree keyed by both versions; prints the directory holding the CRDs.
set -euo pipefail
API="${PLUGDB_PROMETHEUS_OPERATOR_API:-v0.95.2}"
TOOLS="${PLUGDB_CONTROLLER_TOOLS:-v0.23.0}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/monitoring-crds-$API-$TOOLS"
if [[ -s "$OUT/monitoring.coreos.com_podmonitors.yaml" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { echo "monitoring-crds: 'go' is missing" >&2; exit 1; }
echo "monitoring-crds: generating the Prometheus Operator's CRDs ($API, controller-gen $TOOLS) into $OUT (once)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'module plugdb.local/monitoring-crds\n\ngo 1.24\n' > go.mod
export GOFLAGS=-mod=mod
go get "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring@$API" \
  "sigs.k8s.io/controller-tools/cmd/controller-gen@$TOOLS" >/dev/null 2>&1 \
  || { echo "monitoring-crds: the Go module proxy did not serve prometheus-operator's API $API or controller-tools $TOOLS" >&2; exit 1; }
go build -o controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen
rm -rf "$OUT.partial"
mkdir -p "$OUT.partial"
./controller-gen crd:allowDangerousTypes=true \
  paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 output:crd:dir="$OUT.partial"
[[ -s "$OUT.partial/monitoring.coreos.com_podmonitors.yaml" ]] || { echo "monitoring-crds: no PodMonitor CRD was generated" >&2; exit 1; }
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
echo "$OUT"
