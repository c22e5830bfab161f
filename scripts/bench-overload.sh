#!/usr/bin/env bash
# bench-overload.sh — resident memory under overload: Nexmark Q5 (every operator at parallelism
# P) is fed at FACTOR x its sustainable input rate for DURATION seconds, in streamscale-engine and, side
# by side in the same run, in Apache Flink 2.3 (same query shape as bench-nexmark.sh); RSS is
# sampled once a second. The sustainable rate of each system is measured first by a bounded
# run at full speed on the same query (records / wall seconds).
#
# Needs what scripts/bench-nexmark.sh needs (Rust, Java 17, python3, pip on the first run).
# Knobs: P (default 2), FACTOR (default 3), DURATION (seconds, default 60), EVENTS (calibration run,
#        default 2000000), FLINK_ROWS (Flink calibration, default 1500000), FLINK=0 (skip
#        Flink), OUT (default target/bench-overload.jsonl), BUILD=0 (use the release
#        binary as built).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
H=${BENCH_HOME:-$HOME/.cache/streamscale/flink}
FH=$H/flink-2.3.0
RUN=$H/run
B=http://127.0.0.1:8081
P=${P:-2}
FACTOR=${FACTOR:-3}
DURATION=${DURATION:-60}
EVENTS=${EVENTS:-2000000}
FLINK_ROWS=${FLINK_ROWS:-1500000}
OUT=${OUT:-$ROOT/target/bench-overload.jsonl}
NB=$ROOT/bench/nexmark_bench.py
OB=$ROOT/bench/overload_bench.py
log() { echo "[$(date +%T)] $*" >&2; }
rate_of() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["records"]/r["wall_s"])'; }

log "building streamscale-engine (release)"
[ "${BUILD:-1}" = 0 ] || (cd "$ROOT" && cargo build -q --release -p streamscale-engine)
ENGINE=${ENGINE:-$ROOT/target/release/streamscale-engine}

: > "$OUT"
log "streamscale q5 p=$P: sustainable rate ($EVENTS events at full speed)"
R=$(python3 "$NB" engine "$ENGINE" "$ROOT/examples/nexmark/q5.yaml" "$EVENTS" "$P" | rate_of)
RATE=$(python3 -c "print($FACTOR * $R)")
log "streamscale: sustainable $R rec/s; overload at $RATE rec/s for $DURATION s"
python3 "$OB" engine "$ENGINE" "$ROOT/examples/nexmark/q5.yaml" "$RATE" "$P" "$DURATION" | tee -a "$OUT" >/dev/null

if [ "${FLINK:-1}" != 0 ]; then
  # shellcheck source=../bench/flink/cluster.sh
  . "$ROOT/bench/flink/cluster.sh"
  python3 "$NB" flink "$JAR" "$ROOT/bench/flink/sql/q1.sql" 1000000 1 "$TM_PID" >/dev/null # warm-up
  log "flink q5 p=$P: sustainable rate ($FLINK_ROWS rows at full speed)"
  RF=$(python3 "$NB" flink "$JAR" "$ROOT/bench/flink/sql/q5.sql" "$FLINK_ROWS" "$P" "$TM_PID" | rate_of)
  RATEF=$(python3 -c "print($FACTOR * $RF)")
  log "flink: sustainable $RF rec/s; overload at $RATEF rec/s for $DURATION s"
  python3 "$OB" flink "$JAR" "$ROOT/bench/flink/sql/q5.sql" "$RATEF" "$P" "$DURATION" "$TM_PID" | tee -a "$OUT" >/dev/null
fi
echo "machine: $(nproc) cores, $(uname -sr)"
python3 "$OB" table "$OUT"
