#!/usr/bin/env bash
# Builds the node's add-ons from their Go modules, once, into a cache outside the work
# tree keyed by version: CoreDNS (cluster DNS), local-path-provisioner (dynamic volumes)
# and kube-router (its firewall alone: NetworkPolicy enforcement with iptables and ipset).
# Prints `NAME=PATH` lines for the node harness.
set -euo pipefail
COREDNS_VERSION="${PLUGDB_COREDNS_VERSION:-1.15.0}"
LOCAL_PATH_VERSION="${PLUGDB_LOCAL_PATH_VERSION:-0.0.30}"
KUBE_ROUTER_VERSION="${PLUGDB_KUBE_ROUTER_VERSION:-2.1.0}"
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

build coredns github.com/coredns/coredns "$COREDNS_VERSION"
build local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION"
build kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$KUBE_ROUTER_VERSION"
