#!/usr/bin/env bash
# Runs plugdb end to end on this machine: a throwaway local control plane, the CRD,
# the sample Database from examples/, then shows what plugdb made of it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bins=$(scripts/control-plane.sh)
export PATH="$bins:$PATH"

work=$(mktemp -d -t plugdb-run-XXXXXX)
export KUBECONFIG="$work/kubeconfig"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cargo build -q -p plugdb -p plugdb-tests --bins
target/debug/control-plane "$KUBECONFIG" 2>"$work/control-plane.log" &
pids+=($!)
for _ in $(seq 600); do [[ -f $KUBECONFIG ]] && break; sleep 0.1; done
[[ -f $KUBECONFIG ]] || { cat "$work/control-plane.log" >&2; echo "run: control plane did not start" >&2; exit 1; }

kubectl apply -f crds/
kubectl wait --for condition=established --timeout=30s crd/databases.plugdb.io
kubectl apply -f examples/orders-db.yaml
kubectl get db
