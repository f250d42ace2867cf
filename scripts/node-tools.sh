#!/usr/bin/env bash
# Builds the node's add-ons from their Go modules, once, into a cache outside the work
# tree keyed by version: CoreDNS (cluster DNS), local-path-provisioner (dynamic volumes)
# and kube-router (its firewall alone: NetworkPolicy enforcement with iptables and ipset);
# volumes that really grow: the CSI sidecars external-provisioner and external-resizer,
# and csi-loop (tests/csi-loop, keyed by its source); metrics-server (the resource
# metrics API an autoscaler reads). Prints `NAME=PATH` lines for the node harness.
set -euo pipefail
COREDNS_VERSION="${PLUGDB_COREDNS_VERSION:-1.15.0}"
LOCAL_PATH_VERSION="${PLUGDB_LOCAL_PATH_VERSION:-0.0.30}"
KUBE_ROUTER_VERSION="${PLUGDB_KUBE_ROUTER_VERSION:-2.1.0}"
PROVISIONER_VERSION="${PLUGDB_CSI_PROVISIONER_VERSION:-5.3.0}"
RESIZER_VERSION="${PLUGDB_CSI_RESIZER_VERSION:-1.14.0}"
METRICS_SERVER_VERSION="${PLUGDB_METRICS_SERVER_VERSION:-0.8.0}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"

# build NAME MODULE VERSION: go install MODULE@vVERSION into $CACHE/NAME-vVERSION.
build() {
  local name=$1 module=$2 version=$3 out="$CACHE/$1-v$3"
  if [[ ! -x $out/$name ]]; then
    command -v go >/dev/null || { echo "node-tools: 'go' is not on PATH; it is needed to build $name $version" >&2; exit 1; }
    echo "node-tools: building $name v$version into $out (once)" >&2
    mkdir -p "$out"
    GOBIN="$out" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$module@v$version" >&2
    [[ -x $out/$name ]] || { echo "node-tools: build finished but $out/$name is missing" >&2; exit 1; }
  fi
  echo "$name=$out/$name"
}

# build_in_tree NAME MODULE VERSION PACKAGE: a module whose go.mod replaces some of what
# it needs, which `go install` refuses: built inside a copy of its own tree, as its
# project builds it.
build_in_tree() {
  local name=$1 module=$2 version=$3 package=$4 out="$CACHE/$1-v$3"
  if [[ ! -x $out/$name ]]; then
    command -v go >/dev/null || { echo "node-tools: 'go' is not on PATH; it is needed to build $name $version" >&2; exit 1; }
    echo "node-tools: building $name v$version into $out (once)" >&2
    local src work
    src=$(GOFLAGS=-mod=mod go mod download -json "$module@v$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d $src ]] || { echo "node-tools: the Go module proxy did not serve $module v$version" >&2; exit 1; }
    work=$(mktemp -d)
    cp -r "$src/." "$work"
    chmod -R u+w "$work"
    mkdir -p "$out"
    (cd "$work" && GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/$name" "./$package") >&2
    rm -rf "$work"
    [[ -x $out/$name ]] || { echo "node-tools: build finished but $out/$name is missing" >&2; exit 1; }
  fi
  echo "$name=$out/$name"
}

# csi-loop, from this tree: cached by the digest of its source.
build_csi_loop() {
  local src digest out
  src="$(cd "$(dirname "$0")/../tests/csi-loop" && pwd)"
  digest=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-16)
  out="$CACHE/csi-loop-$digest"
  if [[ ! -x $out/csi-loop ]]; then
    command -v go >/dev/null || { echo "node-tools: 'go' is not on PATH; it is needed to build csi-loop" >&2; exit 1; }
    echo "node-tools: building csi-loop into $out (once for this source)" >&2
    mkdir -p "$out"
    (cd "$src" && GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/csi-loop" .) >&2
  fi
  echo "csi-loop=$out/csi-loop"
}

build coredns github.com/coredns/coredns "$COREDNS_VERSION"
build local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION"
build kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$KUBE_ROUTER_VERSION"
build metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server "$METRICS_SERVER_VERSION"
build_in_tree csi-provisioner github.com/kubernetes-csi/external-provisioner/v5 "$PROVISIONER_VERSION" cmd/csi-provisioner
build_in_tree csi-resizer github.com/kubernetes-csi/external-resizer "$RESIZER_VERSION" cmd/csi-resizer
build_csi_loop
