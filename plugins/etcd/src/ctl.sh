# ctl ARGS: etcdctl against the members other than $SELF, each by its own name. Not
# through the headless Service's name: it resolves to every member and pins etcdctl to
# one, maybe a learner (which refuses nearly every request, its own promotion included)
# or $SELF; given the members one by one, etcdctl moves on to one that answers.
ctl() { etcdctl --endpoints="$(others)" --dial-timeout=2s --command-timeout=10s "$@"; }

# others: the client URL of every member DNS knows (the headless Service publishes
# members that are not ready too) other than $SELF; the Service's name when none is known.
others() {
  sts=${SELF%-*} urls="" i=0 misses=0
  while [ "$misses" -lt 3 ] && [ "$i" -lt 128 ]; do
    host="$sts-$i.$HEADLESS_HOST"
    if [ "$sts-$i" = "$SELF" ]; then
      :
    elif getent hosts "$host" >/dev/null 2>&1; then
      urls="$urls${urls:+,}$SCHEME://$host:2379" misses=0
    else
      misses=$((misses + 1))
    fi
    i=$((i + 1))
  done
  echo "${urls:-$SCHEME://$HEADLESS_HOST:2379}"
}
