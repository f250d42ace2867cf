#!/usr/bin/env bash
# Builds the container images the test node runs, from Debian packages, without a
# registry: one minbase root filesystem per Debian suite (shared by that suite's
# engines), the engine packages installed on top, laid out like the official images
# the plugins render, packed as single-layer `docker save` archives whose layer is
# gzipped (containerd keeps it compressed: a third of the disk in each node's store).
#
#   scripts/node-images.sh            builds what is missing, prints the index file
#   scripts/node-images.sh --operator BINARY [ENGINES]
#                                     the operator's image around BINARY (a `plugdb`
#                                     build), with the bundled engines' components in
#                                     ENGINES; prints an index file of that one image
#   scripts/node-images.sh --add-on NAME BINARY PACKAGES
#                                     a node add-on's image: BINARY as
#                                     /usr/local/bin/NAME over bookworm with PACKAGES,
#                                     run as root; prints an index file of that one image
#
# The index (one line per archive: `ARCHIVE CONFIG_DIGEST TAG...`) is what the node
# harness imports. Archives are cached under IMAGES_VERSION: raise it when a recipe
# below changes. The Debian base of each suite is cached apart, by suite.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${PLUGDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugdb}"
IMAGES_VERSION=1
OUT="$CACHE/images-v$IMAGES_VERSION"
BASES="$CACHE/debian-base"
mkdir -p "$OUT" "$BASES"
MIRROR="${PLUGDB_DEBIAN_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

for tool in debootstrap gcc tar gzip sha256sum; do
  command -v "$tool" >/dev/null || { echo "node-images: '$tool' is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "node-images: building root filesystems needs root (debootstrap, chroot)" >&2; exit 1; }

log() { echo "node-images: $*" >&2; }

# pack ROOTFS ARCHIVE USER CMD_JSON ENV... : a single-layer image archive; prints its config digest.
pack() {
  local rootfs=$1 archive=$2 user=$3 cmd=$4; shift 4
  local tmp; tmp=$(mktemp -d "$OUT/pack.XXXXXX")
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$tmp/layer.tar" .
  local diff; diff=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
  local env="" e
  for e in "$@"; do env+="${env:+,}\"$e\""; done
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":[%s],"Cmd":%s,"User":"%s","WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$env" "$cmd" "$user" "$diff" > "$tmp/config.json"
  local config; config=$(sha256sum "$tmp/config.json" | cut -d' ' -f1)
  mkdir "$tmp/$diff"; gzip -1 -n -c "$tmp/layer.tar" > "$tmp/$diff/layer.tar"; rm "$tmp/layer.tar"; mv "$tmp/config.json" "$tmp/$config.json"
  printf '[{"Config":"%s.json","RepoTags":[],"Layers":["%s/layer.tar"]}]' "$config" "$diff" > "$tmp/manifest.json"
  tar -C "$tmp" -cf "$archive.tmp" manifest.json "$config.json" "$diff/layer.tar"
  mv "$archive.tmp" "$archive"
  rm -rf "$tmp"
  echo "sha256:$config"
}

# The operator's image: the `plugdb` binary and the libraries it links, and the bundled
# engines (postgres, mysql, etcd) where it loads them, nothing else (what
# deploy/Dockerfile's distroless image holds). Backup and restore Jobs run its
# `plugdb transfer` to move artefacts to and from object storage. One build is kept,
# keyed by the digests of what goes in.
if [[ ${1:-} == --operator ]]; then
  binary=${2:?"node-images: --operator needs the plugdb binary"}
  engines=${3:-}
  [[ -x $binary ]] || { echo "node-images: $binary is not an executable" >&2; exit 1; }
  bundled=()
  [[ -n $engines ]] && bundled=("$engines/postgres.wasm" "$engines/mysql.wasm" "$engines/etcd.wasm")
  digest=$(sha256sum "$binary" "${bundled[@]}" | cut -c1-64 | sha256sum | cut -c1-12)
  archive="$OUT/operator-$digest.tar"
  if [[ ! -f $archive.digest ]]; then
    rm -f "$OUT"/operator-*.tar "$OUT"/operator-*.tar.digest
    dir=$(mktemp -d "$OUT/operator.XXXXXX")
    install -D -s -m 755 "$binary" "$dir/usr/local/bin/plugdb"  # stripped: members copy it for their agent
    for engine in "${bundled[@]}"; do install -D -m 644 "$engine" "$dir/usr/local/lib/plugdb/engines/$(basename "$engine")"; done
    for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do cp -L --parents "$lib" "$dir"; done
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] && install -D -m 644 /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
    mkdir -p "$dir/tmp"; chmod 1777 "$dir/tmp"
    pack "$dir" "$archive" "65532" '["/usr/local/bin/plugdb","run"]' "PATH=/usr/local/bin:/usr/bin:/bin" > "$archive.digest"
    rm -rf "$dir"
  fi
  echo "$archive $(cat "$archive.digest") localhost/plugdb/operator:$digest" > "$OUT/operator.index"
  echo "$OUT/operator.index"
  exit 0
fi

# base SUITE: a minbase root filesystem tarball for SUITE (built once).
base() {
  local suite=$1 tarball="$BASES/$1-minbase.tar"
  if [[ ! -f $tarball ]]; then
    log "debootstrap $suite (minbase) from $MIRROR"
    local dir; dir=$(mktemp -d "$BASES/$suite.XXXXXX")
    debootstrap --variant=minbase "$suite" "$dir" "$MIRROR" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    rm -f "$dir.log"
    tar --numeric-owner -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
  fi
  echo "$tarball"
}

# engine NAME SUITE PACKAGES COMPAT: the base plus PACKAGES, made official-looking by COMPAT.
# Prints "ARCHIVE DIGEST ROOTFS" with ROOTFS left in place for COMPAT's tags.
engine_rootfs() {
  local name=$1 suite=$2 packages=$3
  local dir="$OUT/$name.rootfs"
  rm -rf "$dir"; mkdir -p "$dir"
  tar --numeric-owner -C "$dir" -xf "$(base "$suite")"
  # No service starts inside the chroot; the image's own bootstrap initialises data.
  printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"; chmod +x "$dir/usr/sbin/policy-rc.d"
  echo "deb $MIRROR $suite main" > "$dir/etc/apt/sources.list"
  mount -t proc proc "$dir/proc"
  log "installing $packages into $name ($suite)"
  if ! chroot "$dir" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages" \
    >"$dir.log" 2>&1; then
    umount "$dir/proc"; tail -30 "$dir.log" >&2; exit 1
  fi
  rm -f "$dir.log"
  umount "$dir/proc"
  chroot "$dir" apt-get clean
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/var/cache/apt/*.bin \
    "$dir"/var/log/*.log "$dir/usr/sbin/policy-rc.d"
}

# uid999 ROOTFS USER: the official images run their engine as USER with uid and gid 999.
uid999() {
  local dir=$1 user=$2 uid gid
  uid=$(chroot "$dir" id -u "$user"); gid=$(chroot "$dir" id -g "$user")
  if [[ $uid != 999 ]]; then
    chroot "$dir" groupmod -g 999 "$user"
    chroot "$dir" usermod -u 999 -g 999 "$user"
    find "$dir" -xdev \( -uid "$uid" -o -gid "$gid" \) -exec chown -h 999:999 {} +
  fi
}

# A node add-on's image (kube-router: its binary, and the iptables and ipset it runs),
# keyed by the binary's digest and the packages.
if [[ ${1:-} == --add-on ]]; then
  name=${2:?"node-images: --add-on needs a name"} binary=${3:?"node-images: --add-on needs a binary"} packages=${4:-}
  [[ -x $binary ]] || { echo "node-images: $binary is not an executable" >&2; exit 1; }
  digest=$( (sha256sum "$binary" | cut -c1-64; echo "$packages") | sha256sum | cut -c1-12)
  archive="$OUT/$name-$digest.tar"
  if [[ ! -f $archive.digest ]]; then
    rm -f "$OUT/$name"-*.tar "$OUT/$name"-*.tar.digest
    if [[ -n $packages ]]; then
      engine_rootfs "$name" bookworm "$packages"
    else
      mkdir -p "$OUT/$name.rootfs"
    fi
    install -D -m 755 "$binary" "$OUT/$name.rootfs/usr/local/bin/$name"
    pack "$OUT/$name.rootfs" "$archive" 0 "[\"/usr/local/bin/$name\"]" "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" > "$archive.digest"
    rm -rf "$OUT/$name.rootfs"
  fi
  echo "$archive $(cat "$archive.digest") localhost/plugdb/$name:$digest" > "$OUT/$name.index"
  echo "$OUT/$name.index"
  exit 0
fi

index="$OUT/index"
entries=()
add() { entries+=("$*"); }

# postgres MAJOR SUITE
postgres() {
  local major=$1 suite=$2 archive="$OUT/postgres-$1.tar"
  if [[ ! -f $archive.digest ]]; then
    engine_rootfs "postgres-$major" "$suite" "postgresql-$major postgresql-client-$major procps"
    local dir="$OUT/postgres-$major.rootfs"
    rm -rf "$dir/var/lib/postgresql/$major" "$dir/etc/postgresql/$major"
    uid999 "$dir" postgres
    mkdir -p "$dir/var/run/postgresql" "$dir/var/lib/postgresql/data"
    chown 999:999 "$dir/var/run/postgresql" "$dir/var/lib/postgresql/data"; chmod 3777 "$dir/var/run/postgresql"
    chroot "$dir" "/usr/lib/postgresql/$major/bin/postgres" --version | awk '{print $3}' > "$archive.version"
    pack "$dir" "$archive" postgres '["postgres"]' \
      "PATH=/usr/lib/postgresql/$major/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      "PGDATA=/var/lib/postgresql/data" "LANG=C.UTF-8" "PG_MAJOR=$major" > "$archive.digest"
    rm -rf "$dir"
  fi
  local minor; minor=$(cat "$archive.version")
  add "$archive $(cat "$archive.digest") docker.io/library/postgres:$major docker.io/library/postgres:$minor"
}

# mariadb SERIES SUITE
mariadb() {
  local series=$1 suite=$2 archive="$OUT/mariadb-$1.tar"
  if [[ ! -f $archive.digest ]]; then
    engine_rootfs "mariadb-$series" "$suite" "mariadb-server mariadb-client procps"
    local dir="$OUT/mariadb-$series.rootfs"
    rm -rf "$dir"/var/lib/mysql/* "$dir"/var/lib/mysql/.[!.]*
    uid999 "$dir" mysql
    mkdir -p "$dir/run/mysqld" "$dir/var/lib/mysql"
    chown 999:999 "$dir/run/mysqld" "$dir/var/lib/mysql"; chmod 0777 "$dir/run/mysqld"
    chroot "$dir" mariadbd --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*-MariaDB' | cut -d- -f1 > "$archive.version"
    local got; got=$(cut -d. -f1,2 "$archive.version")
    [[ $got == "$series" ]] || { echo "node-images: $suite ships MariaDB $got, not $series" >&2; exit 1; }
    pack "$dir" "$archive" mysql '["mariadbd"]' "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "LANG=C.UTF-8" \
      > "$archive.digest"
    rm -rf "$dir"
  fi
  local patch; patch=$(cat "$archive.version")
  add "$archive $(cat "$archive.digest") docker.io/library/mariadb:$series docker.io/library/mariadb:$patch"
}

# etcd SERIES SUITE: the project's etcd image (docker.io/plugdb/etcd), Debian's etcd-server
# and etcd-client: a shell for the plugin's start script, etcdctl for its Jobs. The
# scenarios' own etcdctl is copied out beside the archive.
etcd() {
  local series=$1 suite=$2 archive="$OUT/etcd-$1.tar"
  if [[ ! -f $archive.digest ]]; then
    engine_rootfs "etcd-$series" "$suite" "etcd-server etcd-client"
    local dir="$OUT/etcd-$series.rootfs"
    uid999 "$dir" etcd
    rm -rf "$dir"/var/lib/etcd; mkdir -p "$dir/var/lib/etcd"; chown 999:999 "$dir/var/lib/etcd"
    chroot "$dir" etcd --version | awk '/^etcd Version:/{print $3}' > "$archive.version"
    local got; got=$(cut -d. -f1,2 "$archive.version")
    [[ $got == "$series" ]] || { echo "node-images: $suite ships etcd $got, not $series" >&2; exit 1; }
    install -m 755 "$dir/usr/bin/etcdctl" "$OUT/etcdctl-$series"
    pack "$dir" "$archive" etcd '["etcd"]' "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "LANG=C.UTF-8" \
      > "$archive.digest"
    rm -rf "$dir"
  fi
  local patch; patch=$(cat "$archive.version")
  add "$archive $(cat "$archive.digest") docker.io/plugdb/etcd:$series docker.io/plugdb/etcd:$patch"
}

# exporter NAME PACKAGE BINARY SUITE IMAGE: a community exporter from Debian's PACKAGE,
# laid out as its project publishes IMAGE (`/bin/BINARY`, run as nobody), whose tag must
# be the packaged version: the plugins render that tag.
exporter() {
  local name=$1 package=$2 binary=$3 suite=$4 image=$5 archive="$OUT/$1.tar"
  if [[ ! -f $archive.digest ]]; then
    engine_rootfs "$name" "$suite" "$package"
    local dir="$OUT/$name.rootfs"
    ln -sf "$package" "$dir/usr/bin/$binary"
    local got; got=$(chroot "$dir" "/usr/bin/$package" --version 2>&1 | awk '/version/{print $3; exit}')
    [[ "v$got" == "${image##*:}" ]] || { echo "node-images: $suite ships $package $got, not ${image##*:}" >&2; exit 1; }
    pack "$dir" "$archive" 65534 "[\"/bin/$binary\"]" "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      > "$archive.digest"
    rm -rf "$dir"
  fi
  add "$archive $(cat "$archive.digest") $image"
}

# The pod sandbox's pause process: a static program that sleeps and reaps.
pause() {
  local archive="$OUT/pause.tar"
  if [[ ! -f $archive.digest ]]; then
    local dir; dir=$(mktemp -d "$OUT/pause.XXXXXX")
    cat > "$dir.c" <<'C'
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0}, r = {0};
  a.sa_handler = stop; sigaction(SIGINT, &a, 0); sigaction(SIGTERM, &a, 0);
  r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &r, 0);
  for (;;) pause();
}
C
    gcc -static -Os -o "$dir/pause" "$dir.c"; strip "$dir/pause"; rm -f "$dir.c"
    pack "$dir" "$archive" "65535" '["/pause"]' > "$archive.digest"
    rm -rf "$dir"
  fi
  add "$archive $(cat "$archive.digest") localhost/plugdb/pause:1"
}

# busybox_root DIR APPLET...: busybox in DIR/bin, linked as each APPLET.
busybox_root() {
  local dir=$1 applet; shift
  mkdir -p "$dir/bin"
  cp /bin/busybox "$dir/bin/busybox"
  for applet in "$@"; do ln -s busybox "$dir/bin/$applet"; done
}

# A shell and coreutils for helper pods (the volume provisioner's mkdir/rm): busybox.
helper() {
  local archive="$OUT/helper.tar"
  if [[ ! -f $archive.digest ]]; then
    local dir; dir=$(mktemp -d "$OUT/helper.XXXXXX")
    busybox_root "$dir" sh mkdir rm rmdir chmod ls cat sleep test
    mkdir -p "$dir/tmp"; chmod 1777 "$dir/tmp"
    pack "$dir" "$archive" "" '["/bin/sh"]' "PATH=/bin" > "$archive.digest"
    rm -rf "$dir"
  fi
  add "$archive $(cat "$archive.digest") localhost/plugdb/helper:1"
}

# The test engine `minimal` (tests/fixtures/minimal): a server that listens on its port.
minimal() {
  local archive="$OUT/minimal.tar"
  if [[ ! -f $archive.digest ]]; then
    local dir; dir=$(mktemp -d "$OUT/minimal.XXXXXX")
    busybox_root "$dir" sh httpd
    printf '#!/bin/sh\n# minimal-server --config FILE: serves FILE over HTTP on port 7000.\nexec httpd -f -p 7000 -h "$(dirname "$2")"\n' > "$dir/bin/minimal-server"
    chmod 755 "$dir/bin/minimal-server"
    pack "$dir" "$archive" "" '["/bin/minimal-server"]' "PATH=/bin" > "$archive.digest"
    rm -rf "$dir"
  fi
  add "$archive $(cat "$archive.digest") localhost/plugdb/minimal:1 localhost/plugdb/minimal:2"
}

[[ -x /bin/busybox ]] || { echo "node-images: /bin/busybox is missing (apt-get install busybox-static)" >&2; exit 1; }
pause
helper
minimal
# One suite at a time shares its base; the two suites build side by side.
( postgres 15 bookworm; mariadb 10.11 bookworm; printf '%s\n' "${entries[@]}" > "$OUT/bookworm.list" ) &
bookworm=$!
( postgres 17 trixie; mariadb 11.8 trixie; etcd 3.5 trixie
  exporter postgres-exporter prometheus-postgres-exporter postgres_exporter trixie \
    quay.io/prometheuscommunity/postgres-exporter:v0.17.1
  exporter mysqld-exporter prometheus-mysqld-exporter mysqld_exporter trixie quay.io/prometheus/mysqld-exporter:v0.17.2
  printf '%s\n' "${entries[@]}" > "$OUT/trixie.list" ) &
trixie=$!
wait $bookworm || { echo "node-images: the bookworm images failed" >&2; exit 1; }
wait $trixie || { echo "node-images: the trixie images failed" >&2; exit 1; }
sort -u "$OUT/bookworm.list" "$OUT/trixie.list" > "$index.tmp" && mv "$index.tmp" "$index"
rm -f "$OUT/bookworm.list" "$OUT/trixie.list"
echo "$index"
