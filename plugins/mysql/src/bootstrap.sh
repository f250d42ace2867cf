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
rm -f "$volume/plugdb-ready"

if [ ! -d "$DATADIR/mysql" ]; then
  mariadb-install-db --defaults-file="$cnf" --datadir="$DATADIR" --auth-root-authentication-method=normal --skip-test-db >/dev/null
fi

# Accounts, applied locally on every start and never written to the binary log.
cat > "$volume/init.sql" <<SQL
SET SESSION sql_log_bin = 0;
DELETE FROM mysql.global_priv WHERE User = '' OR (User = 'root' AND Host NOT IN ('localhost', '%'));
FLUSH PRIVILEGES;
CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';
ALTER USER 'root'@'%' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';
ALTER USER 'root'@'localhost' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS 'replicator'@'%' IDENTIFIED BY '$REPLICATION_PASSWORD';
ALTER USER 'replicator'@'%' IDENTIFIED BY '$REPLICATION_PASSWORD';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'replicator'@'%';
SQL

role_args="--read-only=OFF"
[ "$POD_NAME" = "$PRIMARY_POD" ] || role_args="--read-only=ON"

mkdir -p "$(dirname "$MARIADB_SOCKET")"
mariadbd --defaults-file="$cnf" --datadir="$DATADIR" --socket="$MARIADB_SOCKET" --server-id="$server_id" --init-file="$volume/init.sql" $role_args "$@" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server"; exit 0' TERM INT

local_sql() { mariadb --socket="$MARIADB_SOCKET" -uroot -p"$MARIADB_ROOT_PASSWORD" "$@"; }
until local_sql -e 'SELECT 1' >/dev/null 2>&1; do
  kill -0 "$server" 2>/dev/null || { wait "$server"; exit 1; }
  sleep 1
done

if [ "$POD_NAME" != "$PRIMARY_POD" ] && [ ! -f "$volume/plugdb-replica" ]; then
  until mariadb-dump -h "$PRIMARY_HOST" -P "$PRIMARY_PORT" -uroot -p"$MARIADB_ROOT_PASSWORD" \
      --all-databases --single-transaction --gtid --master-data=1 --routines --events --triggers > "$volume/clone.sql"; do
    echo "waiting for the primary at $PRIMARY_HOST:$PRIMARY_PORT to be dumped" >&2
    sleep 2
  done
  # The dump carries the primary's accounts; re-apply ours after loading it.
  cat "$volume/clone.sql" "$volume/init.sql" | local_sql --init-command='SET SESSION sql_log_bin = 0'
  rm -f "$volume/clone.sql"
  local_sql -e "SET SESSION sql_log_bin = 0; FLUSH PRIVILEGES; CHANGE MASTER TO MASTER_HOST='$PRIMARY_HOST', MASTER_PORT=$PRIMARY_PORT, MASTER_USER='replicator', MASTER_PASSWORD='$REPLICATION_PASSWORD', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=2; START SLAVE;"
  touch "$volume/plugdb-replica"
fi
if [ "$POD_NAME" = "$PRIMARY_POD" ] && [ -f "$volume/plugdb-replica" ]; then
  # Promoted: this member no longer follows anyone.
  local_sql -e "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF;"
  rm -f "$volume/plugdb-replica"
fi

touch "$volume/plugdb-ready"
wait "$server"
