#!/usr/bin/env bash
# Runs plugdb end to end on this machine: a throwaway local control plane (real
# etcd, kube-apiserver, kube-controller-manager; a stand-in marks Pods ready since
# no container runtime exists here), the CRD, the bundled engine plugins loaded as
# ConfigMaps, the operator, and the sample Database from examples/.
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

echo "== building plugdb and the engine plugins"
cargo build -q -p plugdb -p plugdb-tests --bins
cargo run -q -p xtask -- plugins "$work/plugins" >/dev/null

echo "== starting a local control plane"
target/debug/control-plane "$KUBECONFIG" 2>"$work/control-plane.log" &
pids+=($!)
for _ in $(seq 900); do [[ -f $KUBECONFIG ]] && break; sleep 0.1; done
[[ -f $KUBECONFIG ]] || { cat "$work/control-plane.log" >&2; echo "run: the control plane did not start" >&2; exit 1; }

echo "== installing the CRD and the bundled plugins"
kubectl apply -f crds/
kubectl wait --for condition=established --timeout=30s crd/databases.plugdb.io
kubectl create namespace plugdb-system
for plugin in "$work"/plugins/*.wasm; do
  target/debug/plugdb plugin pack "$plugin" --namespace plugdb-system | kubectl apply -f -
done

echo "== starting the operator"
target/debug/plugdb run --namespace plugdb-system --listen 127.0.0.1:0 >"$work/operator.log" 2>&1 &
pids+=($!)

echo "== applying examples/orders-db.yaml"
kubectl apply -f examples/orders-db.yaml
if ! kubectl wait --for=jsonpath='{.status.phase}'=Running db/orders --timeout=120s; then
  tail -20 "$work/operator.log" >&2
  exit 1
fi
kubectl get statefulsets,services,secrets,configmaps,pods -l app.kubernetes.io/instance=orders
echo
kubectl get db
