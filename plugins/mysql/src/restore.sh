# plugdb MariaDB restore: loads a backup's dump into the new primary over the network
# and takes the new Database's passwords. To a point in time, it then replays the
# archived binary logs up to that moment.
set -eu
src="$BACKUP_DIR/$BACKUP_NAME/dump.sql.gz"
test -f "$src" || { echo "backup $src not found" >&2; exit 1; }
sql() { mariadb -h "$DB_HOST" -P "$DB_PORT" ${CLIENT_TLS:-} -uroot -p"$MARIADB_ROOT_PASSWORD" "$@"; }
# To a point in time, the dump loads outside the binary log; afterwards the log restarts
# at the source's GTID position when the dump was taken (a comment in the dump, noted on
# the way through), so that the server's position says what has been replayed.
unlogged=""
[ -z "${POINT_IN_TIME:-}" ] || unlogged="SET SESSION sql_log_bin = 0;"
noted="$(mktemp)"
{ echo "$unlogged"
  gunzip -c "$src" | awk -v noted="$noted" '{ print } /^-- SET GLOBAL gtid_slave_pos=/ { print > noted }'
  # The dump carries the source's accounts, which take effect first (the server would
  # otherwise still know this Database's and refuse to change one the dump replaced);
  # then this Database's, and root over the network for the rest of the restore (the
  # members' next start removes that).
  echo "FLUSH PRIVILEGES;"
  accounts_sql "'root'@'%'"
  echo "FLUSH PRIVILEGES;"; } | sql
[ -n "${POINT_IN_TIME:-}" ] || exit 0
start="$(sed -n "s/^-- SET GLOBAL gtid_slave_pos='\([0-9,-]*\)';\$/position:\1/p" "$noted")"
case "$start" in
  position:*) start="${start#position:}" ;;
  *) echo "backup $BACKUP_NAME records no GTID position (it predates point-in-time recovery); restore it without pointInTime" >&2
     exit 1 ;;
esac
sql -e "RESET MASTER; SET GLOBAL gtid_binlog_state = '$start';"

# Archived logs are named <first GTID sequence number>-<closed at>-<server id>-<file>:
# in name order, each continues where the replay stands. Logs of several members
# (after a failover) repeat transactions; each is replayed from the server's position,
# so a transaction applies once.
stop_epoch="$(date -u -d "$POINT_IN_TIME" +%s)"
failed="$(mktemp)"
reached=""
replayed=0
for name in $(ls "$ARCHIVE_DIR" | sort); do
  first="$(echo "$name" | cut -d- -f1 | sed 's/^0*//')"
  closed="$(echo "$name" | cut -d- -f2)"
  position="$(sql -N -B -e 'SELECT @@gtid_binlog_pos')"
  applied="$(echo "$position" | tr ',' '\n' | sed -n 's/^0-[0-9]*-//p')"
  if [ "${first:-0}" -gt $((${applied:-0} + 1)) ]; then
    [ -z "$reached" ] || break
    echo "the archive has a gap: after $position the next archived transaction is $first (in $name); cannot replay to $POINT_IN_TIME" >&2
    exit 1
  fi
  rm -f "$failed"
  { TZ=UTC mariadb-binlog --skip-gtid-strict-mode ${position:+--start-position="$position"} --stop-datetime="$POINT_IN_TIME" \
      "$ARCHIVE_DIR/$name" || touch "$failed"; } | sql
  [ ! -e "$failed" ] || { echo "reading the archived binary log $name failed" >&2; exit 1; }
  replayed=$((replayed + 1))
  [ "$closed" -lt "$stop_epoch" ] || reached=1
done
echo "restored $BACKUP_NAME and replayed $replayed archived binary logs to $POINT_IN_TIME: at $(sql -N -B -e 'SELECT @@gtid_binlog_pos')"
