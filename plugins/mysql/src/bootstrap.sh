#!/bin/sh
# plugdb MariaDB member bootstrap. Runs as the container's entrypoint on every
# member: initialises the data directory, keeps the accounts in step with the
# credentials Secret, and on a fresh replica clones the primary and starts GTID
# replication from the primary Service. Then it waits on the server.
set -eu
cnf="$PLUGDB_CONFIG_DIR/my.cnf"
volume="$(dirname "$DATADIR")"
ordinal="${POD_NAME##*-}"
server_id=$((ordinal + 1))
umask 077
# Passwords, from the files the host mounts: never in the environment, which the server
# and everything it starts would inherit.
IFS= read -r MARIADB_ROOT_PASSWORD < "$PLUGDB_CREDENTIALS/root-password" || [ -n "$MARIADB_ROOT_PASSWORD" ]
IFS= read -r REPLICATION_PASSWORD < "$PLUGDB_CREDENTIALS/replication-password" || [ -n "$REPLICATION_PASSWORD" ]
IFS= read -r APP_PASSWORD < "$PLUGDB_CREDENTIALS/app-password" 2>/dev/null || APP_PASSWORD=${APP_PASSWORD:-}
IFS= read -r MONITOR_PASSWORD < "$PLUGDB_CREDENTIALS/monitor-password" 2>/dev/null || MONITOR_PASSWORD=${MONITOR_PASSWORD:-}

if [ -n "${PLUGDB_FENCED:-}" ] && [ -e "$PLUGDB_FENCED" ]; then
  # Fenced by the member agent (see the plugin's fence command): this member takes no
  # writes again until its pod is made again, as a replica.
  echo "fenced: $(cat "$PLUGDB_FENCED"); waiting to be made again" >&2
  trap 'exit 0' TERM INT
  while :; do sleep 1; done
fi
rm -f "$volume/plugdb-ready"

if [ ! -d "$DATADIR/mysql" ]; then
  mariadb-install-db --defaults-file="$cnf" --datadir="$DATADIR" --auth-root-authentication-method=normal --skip-test-db >/dev/null
fi

# Accounts (accounts.sh), applied locally on every start and never written to the
# binary log. Root logs in from this member alone, never over the network, where its
# password, which anyone who reads the credentials Secret has, would be a login; only
# while a backup is restored into the Database (PLUGDB_RESTORING: the restore Job loads
# it into the primary) does it log in from anywhere, and the next start, once the
# restore has finished and the members roll, removes that login again.
. "$PLUGDB_CONFIG_DIR/accounts.sh"
root_hosts="'localhost', '127.%', '::1'"
network_root=""
if [ -n "${PLUGDB_RESTORING:-}" ]; then
  root_hosts="$root_hosts, '%'"
  network_root="'root'@'%'"
fi
{ echo "SET SESSION sql_log_bin = 0;"
  echo "DELETE FROM mysql.global_priv WHERE User = '' OR (User = 'root' AND Host NOT IN ($root_hosts));"
  echo "FLUSH PRIVILEGES;"
  accounts_sql $network_root; } > "$volume/init.sql"

# A primary does not start replicating (a promoted replica's threads would only be
# stopped again, and stopping one that is connecting to the primary Service, which now
# leads to this member, can take a minute); with synchronous replication its commits
# wait for a replica (a replica's must not: it has no replicas of its own).
role_args="--read-only=OFF --skip-slave-start${SEMI_SYNC:+ --rpl-semi-sync-master-enabled=$SEMI_SYNC}"
[ "$POD_NAME" = "$PRIMARY_POD" ] || role_args="--read-only=ON"

local_sql() { mariadb --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" "$@"; }
# The same, given up after 30 s: the archive loop must not hang on the server.
bounded_sql() { timeout 30 mariadb --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" "$@"; }

# Point-in-time recovery (ARCHIVE_DIR set): the primary hands each closed binary log to
# the archiver, named <first GTID sequence number>-<closed at>-<server id>-<file> so
# that names sort in the order a replay needs, also across failovers. Logs a member
# wrote as a replica are handed over once it is primary (started as one, or promoted in
# place by its agent): they hold what the old primary may not have archived. Logs
# without transactions are skipped.
archived="$volume/plugdb-archived"
archive_closed() {
  index="$DATADIR/mysql-bin.index"
  [ -f "$index" ] || return 0
  sed '$d' "$index" | while read -r entry; do
    file="$DATADIR/${entry##*/}"
    [ -f "$file" ] || continue
    closed="$(stat -c %Y "$file")"
    key="${entry##*/} $closed"
    ! grep -qxF "$key" "$archived" 2>/dev/null || continue
    first="$(mariadb-binlog "$file" 2>/dev/null | grep -m1 -o 'GTID 0-[0-9]*-[0-9]*' | cut -d- -f3)"
    if [ -n "$first" ]; then
      name="$(printf '%020d-%s-%s-%s' "$first" "$closed" "$server_id" "${entry##*/}")"
      cp "$file" "$ARCHIVE_DIR/.$name" && mv "$ARCHIVE_DIR/.$name" "$ARCHIVE_DIR/$name" || continue
      echo "plugdb: handed ${entry##*/} to the archive as $name" >&2
    fi
    echo "$key" >> "$archived"
  done
}
# Whether this member takes writes (it leads).
writable() { [ "$(bounded_sql -N -B -e 'SELECT @@read_only' 2>/dev/null)" = 0 ]; }
# While this member leads, closes the current log at least every ARCHIVE_TIMEOUT
# seconds while transactions arrive.
archive_loop() {
  set +e
  flushed_at="$(bounded_sql -N -B -e 'SELECT @@gtid_binlog_pos')"
  last_flush="$(date +%s)"
  while kill -0 "$server" 2>/dev/null; do
    writable || { sleep 2; continue; }
    archive_closed
    now="$(date +%s)"
    if [ $((now - last_flush)) -ge "${ARCHIVE_TIMEOUT:-60}" ]; then
      position="$(bounded_sql -N -B -e 'SELECT @@gtid_binlog_pos')"
      if [ -n "$position" ] && [ "$position" != "$flushed_at" ] && bounded_sql -e 'FLUSH BINARY LOGS'; then
        echo "plugdb: closed the binary log at $position" >&2
        flushed_at="$position"
      fi
      last_flush="$now"
    fi
    sleep 2
  done
}
# On shutdown the primary closes and hands over its last log before the server stops;
# a replica applies what it received (its agent says that position, by which a failover
# or a switchover chooses it to lead, after this restart; and a commit semi-synchronous
# replication confirmed may be in its relay log only), for 20 s at most.
stop() {
  if [ -n "${ARCHIVE_DIR:-}" ] && writable; then
    local_sql -e 'FLUSH BINARY LOGS' >/dev/null 2>&1 && archive_closed || true
  fi
  if [ -f "$volume/plugdb-replica" ]; then
    received=$(bounded_sql -e 'SHOW SLAVE STATUS\G' 2>/dev/null | sed -n 's/^ *Gtid_IO_Pos: \([0-9][-0-9,]*\)$/\1/p') || true
    [ -z "$received" ] || timeout 25 mariadb --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" -N -B \
      -e "SELECT MASTER_GTID_WAIT('$received', 20)" >/dev/null 2>&1 || true
  fi
  kill -TERM "$server" 2>/dev/null
  wait "$server"
  exit 0
}

mkdir -p "$(dirname "$MARIADB_SOCKET")"
mariadbd --defaults-file="$cnf" --datadir="$DATADIR" --socket="$MARIADB_SOCKET" --server-id="$server_id" --init-file="$volume/init.sql" $role_args "$@" &
server=$!
trap stop TERM INT

until local_sql -e 'SELECT 1' >/dev/null 2>&1; do
  kill -0 "$server" 2>/dev/null || { wait "$server"; exit 1; }
  sleep 1
done

# Whether the primary Service leads to a writable server other than this one (the rules
# of a node that has just returned may still lead to this member's old address).
primary_elsewhere() {
  said=$(mariadb -h "$PRIMARY_HOST" -P "$PRIMARY_PORT" ${CLIENT_TLS:-} -ureplicator -p"$REPLICATION_PASSWORD" --connect-timeout=5 \
    -N -B -e "SELECT IF(@@read_only, 0, @@server_id)" 2>/dev/null) || return 1
  [ -n "$said" ] && [ "$said" != 0 ] && [ "$said" != "$server_id" ]
}

# A replica its agent promoted in place follows no one since (the agent cannot remove
# the mark): it led, and rejoins as a former primary.
if [ -f "$volume/plugdb-replica" ] && [ -z "$(local_sql -N -B -e 'SHOW SLAVE STATUS')" ]; then
  rm -f "$volume/plugdb-replica" "$volume/plugdb-replica-tls"
fi

if [ "$POD_NAME" != "$PRIMARY_POD" ] && [ ! -f "$volume/plugdb-replica" ]; then
  until primary_elsewhere && mariadb-dump -h "$PRIMARY_HOST" -P "$PRIMARY_PORT" ${CLIENT_TLS:-} -ureplicator -p"$REPLICATION_PASSWORD" \
      --all-databases --single-transaction --gtid --master-data=1 --routines --events --triggers --no-tablespaces > "$volume/clone.sql"; do
    echo "waiting for the primary at $PRIMARY_HOST:$PRIMARY_PORT to be dumped" >&2
    sleep 2
  done
  # A former primary's binary log may hold commits the new primary never had (its last,
  # unsent, under asynchronous replication): the copy replaces its data, and its binary
  # log and GTID position start again from the copy's.
  local_sql -e 'RESET MASTER'
  # The dump carries the primary's accounts; re-apply ours after loading it.
  cat "$volume/clone.sql" "$volume/init.sql" | local_sql --init-command='SET SESSION sql_log_bin = 0'
  rm -f "$volume/clone.sql"
  local_sql -e "SET SESSION sql_log_bin = 0; FLUSH PRIVILEGES; CHANGE MASTER TO MASTER_HOST='$PRIMARY_HOST', MASTER_PORT=$PRIMARY_PORT, MASTER_USER='replicator', MASTER_PASSWORD='$REPLICATION_PASSWORD', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=2${REPLICATION_TLS:+, $REPLICATION_TLS}; START SLAVE;"
  touch "$volume/plugdb-replica"
  [ -z "${REPLICATION_TLS:-}" ] || touch "$volume/plugdb-replica-tls"
elif [ "$POD_NAME" != "$PRIMARY_POD" ]; then
  # Its agent may have had it follow a member by name: it follows the read-write Service
  # again. TLS may have been turned on or off since it began to follow: the spec says.
  change="MASTER_HOST='$PRIMARY_HOST'"
  if [ -n "${REPLICATION_TLS:-}" ]; then
    change="$change, $REPLICATION_TLS"
    touch "$volume/plugdb-replica-tls"
  elif [ -f "$volume/plugdb-replica-tls" ]; then
    change="$change, MASTER_SSL_CA='', MASTER_SSL_VERIFY_SERVER_CERT=0"
    rm -f "$volume/plugdb-replica-tls"
  fi
  local_sql -e "STOP SLAVE; CHANGE MASTER TO $change; START SLAVE;"
fi
if [ "$POD_NAME" = "$PRIMARY_POD" ] && [ -f "$volume/plugdb-replica" ]; then
  # Promoted: this member no longer follows anyone.
  local_sql -e "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF;"
  rm -f "$volume/plugdb-replica"
fi

# A new LTS series over the last one's data (a major upgrade rolls every member onto the
# new image): each member brings its own system tables up to date, over the socket, once
# (mariadb-upgrade writes nothing to the binary log and records the version it reached
# in the data directory, which the check reads).
if mariadb-upgrade --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" --check-if-upgrade-is-needed >/dev/null 2>&1; then
  echo "upgrading the system tables to this server's version" >&2
  mariadb-upgrade --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" --silent >&2 || echo "mariadb-upgrade failed; see above" >&2
fi

[ -z "${ARCHIVE_DIR:-}" ] || archive_loop &
touch "$volume/plugdb-ready"
wait "$server"
