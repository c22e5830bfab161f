#!/usr/bin/env bash
# Runs every check and test of streamscale on a fresh machine: installs what the build needs,
# builds all binaries (the tests start real engine processes), then format, lint and tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# plotters renders text through fontconfig/freetype.
if ! pkg-config --exists fontconfig freetype2 2>/dev/null; then
  echo "installing fontconfig and freetype development files"
  apt-get update -qq && apt-get install -y -qq pkg-config libfontconfig1-dev libfreetype-dev fonts-dejavu-core >/dev/null
fi
command -v cargo >/dev/null || { echo "error: cargo (Rust) is not installed" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
cargo test --workspace
