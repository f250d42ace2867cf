#!/usr/bin/env bash
# Installs what plugdb's tests need on a Debian machine, idempotently:
# a wasm-capable Rust (unless rustup already has the target), PostgreSQL, MariaDB,
# openssl; the real node's runtime (containerd, runc, CNI plugins, iptables); and,
# built once and cached under ~/.cache/plugdb: the Kubernetes control-plane and node
# binaries, CoreDNS, local-path-provisioner, MinIO, cert-manager, Prometheus and
# promtool (Debian's package, unpacked), the Prometheus Operator's CRDs (generated from its
# module), and the engine and exporter images (from Debian packages).
# The Go builds and the image builds run side by side.
#   scripts/install-deps.sh [packages|builds]    one part only (default: both, in order)
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case $part in all | packages | builds) ;; *) echo "install-deps: say packages, builds or nothing, not '$part'" >&2; exit 2 ;; esac

if [[ $part != builds ]]; then
  need=(openssl postgresql mariadb-server containerd runc containernetworking-plugins iptables iproute2
    debootstrap busybox-static util-linux procps xfsprogs)
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    need+=(rustc-web cargo-web rust-web-src lld-19)
  fi
  missing=()
  for pkg in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}" >&2
    sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi

  # Database servers in the tests run as this unprivileged user when the tests run as root.
  if [[ $(id -u) == 0 ]] && ! id plugdb-test >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin plugdb-test
  fi

  for tool in cargo rustfmt cargo-clippy go; do
    command -v "$tool" >/dev/null || { echo "install-deps: '$tool' is missing (rustup component add rustfmt clippy; Go >= 1.26 for the control plane)" >&2; exit 1; }
  done
fi
[[ $part == packages ]] && exit 0

[[ $(id -u) == 0 ]] || { echo "install-deps: the real node and its images need root" >&2; exit 1; }
# What the Go builds download and compile (several GiB) is needed only while they run:
# their outputs are cached by version, so the modules and the build cache go with them.
cache="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
mkdir -p "$cache"
scratch=$(mktemp -d "$cache/go-scratch.XXXXXX")
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
export GOCACHE="$scratch/build" GOMODCACHE="$scratch/mod" GOPATH="$scratch/path"
# Images build mostly on the network and dpkg; the Go builds on the CPU: side by side.
scripts/node-images.sh >/dev/null &
images=$!
scripts/control-plane.sh >/dev/null
scripts/node-tools.sh >/dev/null
scripts/helm.sh >/dev/null
scripts/minio.sh >/dev/null
scripts/cert-manager.sh >/dev/null
scripts/prometheus.sh >/dev/null
scripts/monitoring-crds.sh >/dev/null
wait $images || { echo "install-deps: building the engine images failed" >&2; exit 1; }
