#!/usr/bin/env bash
# The one command that checks everything: installs what it needs, then formatting,
# lints, and every test tier (unit, plugin fixtures, real engines, real control plane,
# real nodes). The real-node scenarios spend most of their time waiting on servers, so
# they run beside the other tiers, but for the few that must not share the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh packages
# One build of a clean tree: incremental state would only add GiBs of disk and time.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The one-time builds (Kubernetes, engine images, MinIO, cert-manager; cached under
# ~/.cache/plugdb, at once when warm) go on while the workspace builds.
scripts/install-deps.sh builds &
builds=$!
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-run
wait "$builds"

# After the real-node scenarios, not beside them: `run_script` starts nodes of its own,
# `plugin_calls` and `leader_election` time their own progress against deadlines of a
# few seconds, `cli` compiles a plugin as large as a ConfigMap holds within the
# compiler's minute, and `memory_limit` keeps both cores busy for minutes (hundreds of
# Databases and a compile bomb), which the node-loss scenario's six Databases starting
# beside it could not share.
after=(run_script plugin_calls leader_election cli memory_limit)
beside=()
for file in tests/tests/*.rs; do
  name=$(basename "$file" .rs)
  [[ " ${after[*]} " == *" $name "* ]] || beside+=(--test "$name")
done

cargo test -p plugdb-tests --locked --test real_node > >(sed -u 's/^/real_node| /') 2>&1 &
real_node=$!
status=0
cargo test --workspace --exclude plugdb-tests --locked --no-fail-fast || status=1
cargo test -p plugdb-tests --locked --no-fail-fast --lib "${beside[@]}" || status=1
wait "$real_node" || status=1
cargo test -p plugdb-tests --locked --no-fail-fast "${after[@]/#/--test=}" || status=1
exit "$status"
