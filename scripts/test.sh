#!/usr/bin/env bash
# The one command that checks everything: installs what it needs, then formatting,
# lints, and every test tier (unit, plugin fixtures, real engines, real control plane).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
