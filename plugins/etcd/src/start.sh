# Starts one etcd member. Rendered by the plugdb etcd plugin.
#
# Membership is etcd's own; this script only decides how this member starts:
# - a member with data that its cluster still lists starts as it is;
# - a member the cluster lists but never saw start (added by a scale Job, or re-added
#   after a removal) joins with what the cluster lists, dropping any old data;
# - a fresh member the cluster does not list adds itself, then joins (members of a
#   new Database join member 0 this way);
# - members are added as learners, which do not count towards the quorum (so the
#   cluster keeps answering while one joins), and promote themselves to voters once
#   they have caught up; etcd takes one learner at a time, so members join one by one;
# - a member that was removed waits, not ready, until it is added again or deleted;
# - when no member answers, member 0 without data starts a new cluster; the others wait.
set -eu
# Until etcd takes over the process, a stop ends the wait at once.
trap 'exit 0' TERM INT
pause() { sleep "$1" & wait $!; }
me=$POD_NAME
SELF=$me
ordinal=${me##*-}
peer="$SCHEME://$me.$HEADLESS_HOST:2380"
client="$SCHEME://$me.$HEADLESS_HOST:2379"
data=$DATA_DIR
mkdir -p "$data"
chmod 700 "$data"
say() { echo "plugdb: $*" >&2; }

# promote_when_caught_up ID: in the background, until etcd accepts it (a learner is
# promoted only once it has the leader's log).
promote_when_caught_up() {
  ( for _ in $(seq 600); do
      if ctl member promote "$1" >/dev/null 2>&1; then say "$me votes now"; exit 0; fi
      sleep 2
    done ) &
}

start() { # start STATE [INITIAL_CLUSTER]
  exec etcd --name "$me" --data-dir "$data" \
    --listen-peer-urls "$SCHEME://0.0.0.0:2380" --listen-client-urls "$SCHEME://0.0.0.0:2379" \
    --initial-advertise-peer-urls "$peer" --advertise-client-urls "$client" \
    --initial-cluster-token "$CLUSTER_TOKEN" --initial-cluster-state "$1" --initial-cluster "${2:-$me=$peer}"
}

# initial_cluster LIST: name=peer for every member LIST names (the first label of its
# peer host is its pod name, also for a member that has not started yet).
initial_cluster() {
  printf '%s\n' "$1" | awk -F', ' '{ split($4, u, "//"); split(u[2], h, "."); printf "%s%s=%s", sep, h[1], $4; sep="," }'
}

while :; do
  if list=$(ctl member list 2>/dev/null); then
    line=$(printf '%s\n' "$list" | grep ", $peer, " || true)
    name=$(printf '%s\n' "$line" | awk -F', ' '{print $3}')
    learner=$(printf '%s\n' "$line" | awk -F', ' '$6 == "true" {print $1}')
    if [ -n "$line" ] && [ -n "$name" ] && [ -d "$data/member" ]; then
      [ -z "$learner" ] || promote_when_caught_up "$learner"
      start existing
    elif [ -n "$line" ] && [ -z "$name" ]; then
      say "joining the cluster as $me"
      rm -rf "$data/member"
      [ -z "$learner" ] || promote_when_caught_up "$learner"
      start existing "$(initial_cluster "$list")"
    elif [ -n "$line" ]; then
      say "$me lost its data: replacing its membership"
      ctl member remove "$(printf '%s\n' "$line" | cut -d, -f1)" || { pause 2; continue; }
    elif [ -d "$data/member" ] && printf '%s\n' "$list" | grep -q ", $me, "; then
      say "the cluster lists $me under another peer address than $peer: etcd cannot change a member's scheme in place," \
        "so TLS is chosen when the Database is created (restore a backup into a new Database to change it)"
      pause 30
      continue
    elif [ -d "$data/member" ]; then
      say "$me was removed from the cluster; waiting to be added again"
      pause 5
      continue
    else
      say "adding $me to the cluster"
      ctl member add "$me" --learner --peer-urls="$peer" >/dev/null || { pause 2; continue; }
    fi
  elif [ -d "$data/member" ]; then
    start existing
  elif [ "$ordinal" = 0 ]; then
    say "no member answers: $me starts a new cluster"
    start new
  else
    say "waiting for a member of the cluster to answer"
    pause 2
  fi
done
