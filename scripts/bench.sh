#!/usr/bin/env bash
# The benchmarks: plugin calls (criterion, then median / p99 / ratio to native), the
# operator's cost curve (100, 1,000 and 10,000 Databases by default) on a real control
# plane, and Databases on the real node (apply to Ready, recovery after the primary
# fails), and what measuring a member costs. Installs what it needs, like scripts/test.sh.
#   scripts/bench.sh [SIZES]      tables in target/plugin-call.md, target/scale-bench.md,
#                                 target/compile-bench.md, target/node-bench.md,
#                                 target/metrics-bench.md, target/metrics-scrape.md and
#                                 target/criterion
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The benches in the same build: their dev-dependencies change the features of crates
# the operator shares (wasmtime's), so building the binaries alone would have
# `cargo bench` build the operator's dependencies a second time.
cargo build --release --locked -p plugdb -p plugdb-tests --bins --benches
# criterion writes beside the crate unless told: keep its results in the build tree.
CRITERION_HOME="$PWD/target/criterion" cargo bench --locked -p plugdb-tests --bench plugin_call
CRITERION_HOME="$PWD/target/criterion" cargo bench --locked -p plugdb-tests --bench metrics_scrape
target/release/scale-bench "${1:-100,1000,10000}" target/scale-bench.md
target/release/compile-bench target/compile-bench.md
target/release/node-bench 3 target/node-bench.md
target/release/metrics-bench 3 60 target/metrics-bench.md
