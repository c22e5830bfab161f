#!/usr/bin/env bash
# A Kafka job autoscaled on real lag: starts a local Apache Kafka broker
# (scripts/kafka-testenv.sh), produces the bundled AAPL trace into topic `tweets` with
# `streamscale load` (4 hours of the trace around its news spike at 60x, scaled x20: about
# 8 records/s, then up to 900/s), and runs examples/jobs/kafka-tweets.yaml under
# `streamscale run` for the same 4 minutes. The report goes to report-kafka/; the window
# results are in topic `tweet-counts` (exactly once for a read_committed reader).
#
#   examples/kafka-demo.sh [DURATION]     default 4m
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DURATION=${1:-4m}
cargo build --release -q --bins
BIN=target/release
./scripts/kafka-testenv.sh install
./scripts/kafka-testenv.sh start
LOAD_PID=
cleanup() {
  [[ -n "$LOAD_PID" ]] && kill "$LOAD_PID" 2>/dev/null || true
  ./scripts/kafka-testenv.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
./scripts/kafka-testenv.sh create-topic tweets 6
./scripts/kafka-testenv.sh create-topic tweet-counts 2
"$BIN/streamscale" load --brokers 127.0.0.1:39092 --topic tweets \
  --trace examples/traces/Twitter_volume_AAPL.rate.csv --start-seconds 2779200 \
  --speedup 60 --scale 20 --keys 1000 --duration "$DURATION" &
LOAD_PID=$!
STREAMSCALE_ENGINE_BIN="$BIN/streamscale-engine" "$BIN/streamscale" run examples/jobs/kafka-tweets.yaml \
  --duration "$DURATION" --report report-kafka
