#!/usr/bin/env bash
# What the site's rules of the findings (CEL) cost: the findings pass over JOBS stored jobs
# (default 100,000), best of three, without and with three rules; prints the wall times and the
# cost per job per rule. Asserts nothing.
#   scripts/bench-rules.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q --example bench-rules
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/release/examples/bench-rules "${1:-100000}" "$dir"
