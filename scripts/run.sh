#!/usr/bin/env bash
# Runs plugdb end to end on this machine, for real: a throwaway control plane and three
# real nodes (containerd + runc + kubelet each, in network namespaces `plugdb-node-a`,
# `-b` and `-c`, zones a, b and c), the
# CRD, the bundled engine plugins loaded as ConfigMaps, the operator, and the sample
# Database from examples/. Ends with `kubectl get db` and a round trip through the
# Services (and where each member runs): a row written through the read-write Service
# is read back through the read-only one (a replica). Then it keeps the cluster up until Ctrl-C.
#
#   scripts/run.sh            keep running; Ctrl-C tears everything down
#   scripts/run.sh --check    exit after the round trip
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[[ ${1:-} == --check ]] && check=1
[[ $(id -u) == 0 ]] || { echo "run: the real nodes need root (network namespace, mounts, cgroups)" >&2; exit 1; }
scripts/install-deps.sh
bins=$(scripts/control-plane.sh)
export PATH="$bins:$PATH"

work=$(mktemp -d -t plugdb-run-XXXXXX)
export KUBECONFIG="$work/kubeconfig"
node_pid=""
operator_pid=""
# Runs to the end whatever is already gone (an operator that died, a node that never
# started): nothing here may stop it.
cleanup() {
  set +e
  if [[ -n $operator_pid ]]; then kill "$operator_pid" 2>/dev/null; fi
  # The node tears itself down (containers, namespace, kernel settings) on SIGTERM.
  if [[ -n $node_pid ]]; then
    kill -TERM "$node_pid" 2>/dev/null
    wait "$node_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building plugdb and the engine plugins"
cargo build -q -p plugdb -p plugdb-tests --bins
built="${CARGO_TARGET_DIR:-target}/debug"
cargo run -q -p xtask -- plugins "$work/plugins" >/dev/null

echo "== starting a control plane and three real nodes (containerd, kubelet, kube-proxy, kube-router; CoreDNS, local-path)"
"$built/node" "$KUBECONFIG" 2>"$work/node.log" &
node_pid=$!
for _ in $(seq 1800); do
  [[ -f $KUBECONFIG ]] && break
  kill -0 "$node_pid" 2>/dev/null || break
  sleep 0.1
done
[[ -f $KUBECONFIG ]] || { cat "$work/node.log" >&2; echo "run: the nodes did not start" >&2; exit 1; }
kubectl get nodes -L topology.kubernetes.io/zone

echo "== installing the CRD and the bundled plugins"
kubectl apply -f crds/
kubectl wait --for condition=established --timeout=30s crd/databases.plugdb.io
kubectl create namespace plugdb-system
for plugin in "$work"/plugins/*.wasm; do
  "$built/plugdb" plugin pack "$plugin" --namespace plugdb-system | kubectl apply --server-side -f -
done

# As the chart runs it: knowing its own image (which the nodes hold), so every member runs
# the member agent beside its engine (failover, fencing, switchover, positions in status),
# and where it reaches the agents from (this machine's address on the nodes' network), which
# alone the members' NetworkPolicies let reach them.
image=$(cat "$KUBECONFIG.image")
echo "== starting the operator (its image: $image)"
"$built/plugdb" run --namespace plugdb-system --listen 127.0.0.1:0 --image "$image" --agent-from 10.201.0.1 \
  >"$work/operator.log" 2>&1 &
operator_pid=$!

echo "== applying examples/orders-db.yaml"
kubectl apply -f examples/orders-db.yaml
started=$SECONDS
if ! kubectl wait --for=jsonpath='{.status.phase}'=Running db/orders --timeout=300s; then
  tail -20 "$work/operator.log" >&2
  kubectl get pods -o wide >&2
  exit 1
fi
echo "orders Running with its members Ready after $((SECONDS - started)) s"
kubectl get statefulsets,services -l app.kubernetes.io/instance=orders
echo
kubectl get pods -o wide -l app.kubernetes.io/instance=orders
containers=$(kubectl get pod orders-0 -o jsonpath='{.spec.containers[*].name}')
[[ " $containers " == *" agent "* ]] || { echo "run: the members run no member agent (containers: $containers)" >&2; exit 1; }
echo "each member runs its engine and the member agent ($containers)"
echo
kubectl get db

echo
echo "== a round trip through the Services, as the application (Secret orders-app)"
secret() { kubectl get secret orders-app -o jsonpath="{.data.$1}" | base64 -d; }
user=$(secret username) password=$(secret password) dbname=$(secret dbname)
rw=$(kubectl get service orders -o jsonpath='{.spec.clusterIP}')
ro=$(kubectl get service orders-replicas -o jsonpath='{.spec.clusterIP}')
in_node() { nsenter --net=/run/netns/plugdb-node-a "$@"; }
sql() { PGPASSWORD="$password" in_node psql "host=$1 user=$user dbname=$dbname connect_timeout=5" -XAtq -v ON_ERROR_STOP=1 -c "$2"; }
sql "$rw" "CREATE TABLE IF NOT EXISTS greetings (id serial PRIMARY KEY, said text); INSERT INTO greetings (said) VALUES ('hello from $(hostname) at $(date -u +%FT%TZ)')"
echo "wrote a row through orders ($rw, read-write)"
for _ in $(seq 30); do
  row=$(sql "$ro" "SELECT said || ' — read on ' || CASE WHEN pg_is_in_recovery() THEN 'a replica' ELSE 'the primary' END FROM greetings ORDER BY id DESC LIMIT 1" 2>/dev/null || true)
  [[ $row == *"a replica" ]] && break
  sleep 1
done
[[ $row == *"a replica" ]] || { echo "run: the row did not reach a replica through orders-replicas ($ro): '$row'" >&2; exit 1; }
echo "read it back through orders-replicas ($ro, read-only): $row"

if ((check)); then
  echo "== round trip done (--check); tearing down"
  exit 0
fi
cat <<EOF

== the cluster stays up until Ctrl-C
  export KUBECONFIG=$KUBECONFIG
  export PATH=$bins:\$PATH
  kubectl get db,pods
  # the application's login is in the Secret orders-app (username, password, dbname, uri):
  PGPASSWORD=\$(kubectl get secret orders-app -o jsonpath='{.data.password}' | base64 -d) \\
    nsenter --net=/run/netns/plugdb-node-a psql -h $rw -U app app    # read-write; $ro is read-only
  $built/plugdb connect orders    # psql as the superuser, in the primary
  # Service and pod addresses live in the nodes' network namespaces, hence nsenter;
  # or: kubectl port-forward svc/orders 5432 and psql -h 127.0.0.1
  operator log: $work/operator.log
EOF
while kill -0 "$node_pid" 2>/dev/null; do sleep 1; done
