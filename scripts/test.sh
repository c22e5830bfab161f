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

# Incremental caches double the size of target/ and a one-shot run gains nothing from them.
export CARGO_INCREMENTAL=0
# Property tests draw their cases from a fixed seed, so that a run is reproducible (a failure
# on one machine fails on every machine); set PROPTEST_RNG_SEED to another u64 to draw others.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261202}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The API docs build without a broken or private intra-doc link.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo build --workspace --bins
# A real control plane for the operator's tests: kube-apiserver and helm built from the Go module
# proxy (cached in ~/.cache/streamscale/k8s; about 16 minutes the first time on 2 cores), etcd and
# kubectl from Debian. The tests start it; the trap stops it.
./scripts/k8s-testenv.sh build
# A real Apache Flink 2.3 session cluster for the Flink backend's tests: Flink from its PyPI
# wheels, the demo job compiled with javac and the Kafka-fed job with flink-connector-kafka from
# Maven Central (mvn) (cached in ~/.cache/streamscale/flink; about a minute and about 1.2 GB with
# the PyFlink venv the first time). The tests start and stop the cluster.
./scripts/flink-testenv.sh install
# A real Apache Kafka 4.1 broker (KRaft, one node) for the Kafka tests of the engine,
# `streamscale run` and the operator (operator/tests/operator_kafka.rs, with the k8s testenv
# above): its jars from Maven Central with mvn (cached in ~/.cache/streamscale/kafka, about
# 55 MB). The tests start and stop the broker.
./scripts/kafka-testenv.sh install
trap './scripts/k8s-testenv.sh stop >/dev/null 2>&1 || true; ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true; ./scripts/kafka-testenv.sh stop >/dev/null 2>&1 || true' EXIT
cargo test --workspace
