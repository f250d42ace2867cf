#!/usr/bin/env bash
# Unpacks Debian's prometheus package (prometheus and promtool) once into a cache
# outside the work tree keyed by version, and prints the directory holding both. The
# package is only unpacked, never installed: nothing starts, no user is made.
set -euo pipefail
VERSION="${PLUGDB_PROMETHEUS_DEB:-2.42.0+ds-5+deb12u1}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/prometheus-$VERSION"
if [[ -x "$OUT/usr/bin/promtool" && -x "$OUT/usr/bin/prometheus" ]]; then
  echo "$OUT/usr/bin"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "prometheus: '$tool' is missing (a Debian machine is needed)" >&2; exit 1; }
done
echo "prometheus: unpacking Debian's prometheus $VERSION into $OUT (once)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
if ! (cd "$work" && apt-get download -qq "prometheus=$VERSION" >/dev/null 2>&1); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  (cd "$work" && apt-get download -qq "prometheus=$VERSION" >/dev/null) || { echo "prometheus: cannot download prometheus=$VERSION" >&2; exit 1; }
fi
rm -rf "$OUT.partial"
mkdir -p "$OUT.partial"
dpkg-deb -x "$work"/prometheus_*.deb "$OUT.partial"
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
[[ -x "$OUT/usr/bin/promtool" ]] || { echo "prometheus: unpacked, but $OUT/usr/bin/promtool is missing" >&2; exit 1; }
echo "$OUT/usr/bin"
