#!/usr/bin/env bash
# Builds the Debian and RPM packages: the release binary, its man pages and completions, then
# `cargo deb` and `cargo generate-rpm` (installed when missing). Prints the package paths.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cargo-deb cargo-generate-rpm; do
  command -v "$tool" >/dev/null || cargo install --locked --quiet "$tool"
done
cargo build --release --locked
rm -rf target/assets
target/release/ceems generate-assets target/assets >/dev/null
deb=$(cargo deb --no-build --locked 2>/dev/null | tail -n 1)
cargo generate-rpm >/dev/null
rpm=$(ls -t target/generate-rpm/*.rpm | head -n 1)
echo "$deb"
echo "$rpm"
