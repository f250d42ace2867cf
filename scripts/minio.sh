#!/usr/bin/env bash
# Builds the MinIO server (the S3-compatible store the backup tests write to) once from
# the Go module proxy into a cache outside the work tree keyed by version, and prints
# its path.
set -euo pipefail
MINIO_VERSION="${PLUGDB_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
OUT="$CACHE/minio-$MINIO_VERSION"
if [[ -x "$OUT/minio" ]]; then
  echo "$OUT/minio"
  exit 0
fi
command -v go >/dev/null || { echo "minio: 'go' is not on PATH; it is needed to build MinIO $MINIO_VERSION" >&2; exit 1; }
echo "minio: building MinIO $MINIO_VERSION into $OUT (once)" >&2
mkdir -p "$OUT"
GOBIN="$OUT" GOFLAGS="-mod=mod -buildvcs=false -trimpath" CGO_ENABLED=0 go install -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION" >&2
[[ -x "$OUT/minio" ]] || { echo "minio: build finished but $OUT/minio is missing" >&2; exit 1; }
echo "$OUT/minio"
