#!/usr/bin/env bash
# bench-nexmark.sh — records/s and records/s per core for Nexmark Q1, Q2 and Q5 at parallelism 1
# and 2, in streamscale-engine and in Apache Flink 2.3 running the same query shape, in one run
# on this machine; prints a Markdown table with the ratios.
#
# Needs: a Rust toolchain, Java 17 (java, javac, jar), python3, pip (reaching PyPI on the first
# run), curl, unzip. Flink is assembled from the `apache-flink` and `apache-flink-libraries`
# wheels under $BENCH_HOME (default ~/.cache/streamscale/flink); every socket binds 127.0.0.1
# (Flink's REST port 8081 must be free). See bench/flink/README.md for provenance.
#
# Knobs: EVENTS (streamscale, per run, default 3000000), FLINK_ROWS (Q1/Q2, default 4000000),
#        FLINK_ROWS_Q5 (default 2000000), OUT (results, default target/bench-nexmark.jsonl), BUILD=0 (use the
#        release binary as built).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
H=${BENCH_HOME:-$HOME/.cache/streamscale/flink}
FH=$H/flink-2.3.0
RUN=$H/run
B=http://127.0.0.1:8081
EVENTS=${EVENTS:-3000000}
FLINK_ROWS=${FLINK_ROWS:-4000000}
FLINK_ROWS_Q5=${FLINK_ROWS_Q5:-2000000}
OUT=${OUT:-$ROOT/target/bench-nexmark.jsonl}
PY=$ROOT/bench/nexmark_bench.py
log() { echo "[$(date +%T)] $*" >&2; }

# ------------------------------------------------------------------ our engine (release build)
log "building streamscale-engine (release)"
[ "${BUILD:-1}" = 0 ] || (cd "$ROOT" && cargo build -q --release -p streamscale-engine)
ENGINE=${ENGINE:-$ROOT/target/release/streamscale-engine}

# ------------------------------------------------------------------ Flink session cluster
# shellcheck source=../bench/flink/cluster.sh
. "$ROOT/bench/flink/cluster.sh"

# ------------------------------------------------------------------ runs, interleaved per query
: > "$OUT"
# Warm-up (JIT and class loading; not reported).
python3 "$PY" flink "$JAR" "$ROOT/bench/flink/sql/q1.sql" 2000000 1 "$TM_PID" >/dev/null
for q in q1 q2 q5; do
  for p in 1 2; do
    rows=$FLINK_ROWS; [ $q = q5 ] && rows=$FLINK_ROWS_Q5
    log "flink $q p=$p ($rows rows)"
    python3 "$PY" flink "$JAR" "$ROOT/bench/flink/sql/$q.sql" "$rows" "$p" "$TM_PID" | tee -a "$OUT" >&2
    log "streamscale $q p=$p ($EVENTS events)"
    python3 "$PY" engine "$ENGINE" "$ROOT/examples/nexmark/$q.yaml" "$EVENTS" "$p" | tee -a "$OUT" >&2
  done
done
echo "machine: $(nproc) cores, $(uname -sr), $(java -version 2>&1 | head -1)"
python3 "$PY" table "$OUT"
