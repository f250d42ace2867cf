#!/usr/bin/env bash
# The one command that checks everything: installs what it needs, then formatting,
# lints, and every test tier (unit, plugin fixtures, real engines, real control plane,
# real nodes). The real-node scenarios spend most of their time waiting on servers, so
# they run beside the other tiers; `run_script` starts nodes of its own and runs after.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-run

beside=()
for file in tests/tests/*.rs; do
  name=$(basename "$file" .rs)
  [[ $name == run_script ]] || beside+=(--test "$name")
done

cargo test -p plugdb-tests --locked --test real_node > >(sed -u 's/^/real_node| /') 2>&1 &
real_node=$!
status=0
cargo test --workspace --exclude plugdb-tests --locked || status=1
cargo test -p plugdb-tests --locked --lib "${beside[@]}" || status=1
wait "$real_node" || status=1
cargo test -p plugdb-tests --locked --test run_script || status=1
exit "$status"
