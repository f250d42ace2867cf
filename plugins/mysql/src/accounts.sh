# The accounts of a member, as SQL (see bootstrap.sh, and restore.sh, which the restore
# Job runs after this): root from the member alone, on the socket and over loopback,
# and from the hosts given besides (`'root'@'%'` while a backup is restored into the
# Database); the replication role, which replicas clone and backups dump as (it reads
# every database and writes none); and the application's, with every right on its own
# database and none elsewhere; and the exporter's (when its password is known), from
# this member alone, which reads the server's status and nothing of its data.
accounts_sql() {
  for account in "'root'@'127.%'" "'root'@'::1'" "$@"; do
    echo "CREATE USER IF NOT EXISTS $account IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';"
    echo "ALTER USER $account IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';"
    echo "GRANT ALL PRIVILEGES ON *.* TO $account WITH GRANT OPTION;"
  done
  echo "ALTER USER 'root'@'localhost' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';"
  echo "CREATE USER IF NOT EXISTS 'replicator'@'%' IDENTIFIED BY '$REPLICATION_PASSWORD';"
  echo "ALTER USER 'replicator'@'%' IDENTIFIED BY '$REPLICATION_PASSWORD';"
  echo "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT, SHOW VIEW, TRIGGER, EVENT, LOCK TABLES, RELOAD ON *.* TO 'replicator'@'%';"
  echo "CREATE DATABASE IF NOT EXISTS app;"
  echo "CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY '$APP_PASSWORD';"
  echo "ALTER USER 'app'@'%' IDENTIFIED BY '$APP_PASSWORD';"
  echo "GRANT ALL PRIVILEGES ON app.* TO 'app'@'%';"
  if [ -n "${MONITOR_PASSWORD:-}" ]; then
    echo "CREATE USER IF NOT EXISTS 'plugdb_monitor'@'127.%' IDENTIFIED BY '$MONITOR_PASSWORD';"
    echo "ALTER USER 'plugdb_monitor'@'127.%' IDENTIFIED BY '$MONITOR_PASSWORD' WITH MAX_USER_CONNECTIONS 3;"
    echo "GRANT PROCESS, REPLICATION CLIENT, SLAVE MONITOR ON *.* TO 'plugdb_monitor'@'127.%';"
    echo "GRANT SELECT ON performance_schema.* TO 'plugdb_monitor'@'127.%';"
  fi
}
