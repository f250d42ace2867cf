# Whether an etcd member is alive (its liveness probe). Rendered by the plugdb etcd plugin.
#
# - While the start script is still the container's first process, it is waiting on
#   its own (to be added to the cluster, for another member to answer): alive. A
#   restart would only start the same wait over, later each time.
# - Once etcd has taken over the process: alive while it listens on the peer port.
proc=${PROC:-/proc}
[ "$(cat "$proc/1/comm")" = etcd ] || exit 0
# A listening socket (state 0A) on port 2380 (094C), IPv4 or IPv6.
grep -Eqs '^ *[0-9]+: [0-9A-F]+:094C [0-9A-F]+:0000 0A ' "$proc/net/tcp" "$proc/net/tcp6"
