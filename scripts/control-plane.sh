#!/usr/bin/env bash
# Builds the real Kubernetes binaries from the k8s.io/kubernetes Go module, once,
# into a cache outside the work tree keyed by version: the control plane
# (kube-apiserver, kube-controller-manager, kubectl) and the node (kube-scheduler,
# kubelet, kube-proxy). Prints the directory holding them (the KUBEBUILDER_ASSETS
# layout). Only missing binaries are built.
#
# Honours KUBEBUILDER_ASSETS for the control plane: when it holds kube-apiserver, the
# node binaries are built beside it only if it lacks them (into the cache).
set -euo pipefail

K8S_VERSION="${PLUGDB_K8S_VERSION:-1.36.3}"
STAGING_VERSION="0.${K8S_VERSION#1.}"
K8S_MINOR="${K8S_VERSION#1.}"; K8S_MINOR="${K8S_MINOR%%.*}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/kubernetes-v$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager kubectl kube-scheduler kubelet kube-proxy)

if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]]; then
  ok=1; for b in "${BINARIES[@]}"; do [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || ok=0; done
  if ((ok)); then echo "$KUBEBUILDER_ASSETS"; exit 0; fi
  echo "control-plane: KUBEBUILDER_ASSETS lacks the node binaries; using the cache instead" >&2
fi

have_all() { for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
if have_all; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "control-plane: 'go' is not on PATH; it is needed to build kube-apiserver $K8S_VERSION" >&2; exit 1; }

work="$CACHE/build-v$K8S_VERSION"
mkdir -p "$work" "$OUT"
cd "$work"
echo "control-plane: building Kubernetes v$K8S_VERSION into $OUT (once; takes several minutes)" >&2

# k8s.io/kubernetes points its staging modules at ./staging; a consumer pins them instead.
mods=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
  cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
  kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)
{
  echo "module plugdb.io/controlplane"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes v$K8S_VERSION"
  echo
  echo "replace ("
  for m in "${mods[@]}"; do echo "	k8s.io/$m => k8s.io/$m v$STAGING_VERSION"; done
  echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
export GOFLAGS="-mod=mod -buildvcs=false"
go mod tidy -e >&2 || true
go mod download >&2
for b in "${BINARIES[@]}"; do
  [[ -x "$OUT/$b" ]] && continue
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR" \
    -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2
  mv "$OUT/$b.tmp" "$OUT/$b"
done
have_all || { echo "control-plane: build finished but binaries are missing in $OUT" >&2; exit 1; }
echo "$OUT"
