#!/usr/bin/env bash
# Kafka -> keyed 1 s window count/sum -> Kafka, exactly-once: the streamscale engine against
# Apache Flink 2.3 with its Kafka connector, on one broker and one pre-filled topic, in one run.
# See README.md beside this script for what is measured and how.
#
#   bench/kafka-flink/run.sh [--records N] [--rounds R] [--parallelism "1 2"] [--keys K]
#                            [--latency-rate R] [--latency-seconds S] [--no-latency] [--no-overhead]
#
# Installs what it needs: a Python venv with confluent-kafka (the read_committed reader, cached in
# $STREAMSCALE_CACHE/bench-kafka-flink, default ~/.cache/streamscale/bench-kafka-flink); the
# broker, the Flink cluster and the Flink job's jar with org.apache.flink:flink-connector-kafka
# (fetched with mvn) come from scripts/kafka-testenv.sh and scripts/flink-testenv.sh (started
# here, stopped at the end). Results: one JSON line per run in $OUT/results.jsonl
# (default target/bench-kafka-flink) and the tables on stdout.
# STREAMSCALE_BIN_DIR: use the streamscale and streamscale-engine binaries there instead of
# building target/release.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/kafka-flink"
CACHE="${STREAMSCALE_CACHE:-$HOME/.cache/streamscale}/bench-kafka-flink"
VENV="$CACHE/venv"
OUT="${OUT:-$ROOT/target/bench-kafka-flink}"

RECORDS=4000000
ROUNDS=2
PARALLELISM="1 2"
KEYS=1000
LAT_RATE=20000
LAT_SECONDS=60
LATENCY=1
OVERHEAD=1
while (($#)); do
  case "$1" in
    --records) RECORDS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --parallelism) PARALLELISM=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --latency-rate) LAT_RATE=$2; shift 2 ;;
    --latency-seconds) LAT_SECONDS=$2; shift 2 ;;
    --no-latency) LATENCY=0; shift ;;
    --no-overhead) OVERHEAD=0; shift ;;
    *) echo "usage: $0 [--records N] [--rounds R] [--parallelism \"1 2\"] [--keys K] [--latency-rate R] [--latency-seconds S] [--no-latency] [--no-overhead]" >&2; exit 2 ;;
  esac
done

log() { echo "bench-kafka-flink: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# ---------------------------------------------------------------------------------- install
install_venv() {
  [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null && return 0
  log "installing confluent-kafka into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
  "$VENV/bin/pip" install -q --disable-pip-version-check "confluent-kafka==2.12.1" ||
    die "pip install confluent-kafka failed"
}

install_venv
PY="$VENV/bin/python"
BENCH="$PY $HERE/bench.py"
if [[ -n "${STREAMSCALE_BIN_DIR:-}" ]]; then
  BIN=$STREAMSCALE_BIN_DIR
else
  (cd "$ROOT" && cargo build --release -q -p streamscale-engine -p streamscale-controller --bins)
  BIN="$ROOT/target/release"
fi
[[ -x "$BIN/streamscale-engine" && -x "$BIN/streamscale" ]] || die "no streamscale/streamscale-engine in $BIN"

"$ROOT/scripts/kafka-testenv.sh" install
# Flink, and the Flink job with flink-connector-kafka in its jar (FLINK_KAFKA_CONNECTOR_VERSION
# picks another connector version; default 5.0.0-2.2).
"$ROOT/scripts/flink-testenv.sh" install
FLINK_ENV=$("$ROOT/scripts/flink-testenv.sh" env)
JOB_JAR=$(sed -n 's/^FLINK_KAFKA_JOB_JAR=//p' <<<"$FLINK_ENV")
FLINK_REST=$(sed -n 's/^FLINK_REST_URL=//p' <<<"$FLINK_ENV")
FLINK_RUN=$(dirname "$(sed -n 's/^FLINK_CONF_DIR=//p' <<<"$FLINK_ENV")")

cleanup() {
  "$ROOT/scripts/flink-testenv.sh" stop >/dev/null 2>&1 || true
  "$ROOT/scripts/kafka-testenv.sh" stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
BROKERS=$("$ROOT/scripts/kafka-testenv.sh" start | sed -n 's/^KAFKA_BROKERS=//p')
"$ROOT/scripts/flink-testenv.sh" start --scheduler default >/dev/null
FLINK_PIDS=("$FLINK_RUN"/pid/*.pid)

mkdir -p "$OUT"
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
WORK="$OUT/$RUN_ID"
mkdir -p "$WORK"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)

# ---------------------------------------------------------------------------------- input
INPUT=bench-in
$BENCH topic "$BROKERS" "$INPUT" 4
printf 't_seconds,rate\n0,250000\n1000000,250000\n' >"$WORK/fill.csv"
have=$($BENCH size "$BROKERS" "$INPUT")
if ((ROUNDS > 0 && have < RECORDS)); then
  # As fast as the producer goes (about 250k records/s here): a constant-rate trace.
  "$BIN/streamscale" load --brokers "$BROKERS" --topic "$INPUT" --trace "$WORK/fill.csv" \
    --keys "$KEYS" --duration "$(python3 -c "print(max(1, ($RECORDS - $have) / 250000))")" \
    >"$WORK/fill.log" 2>&1 || die "streamscale load failed (log: $WORK/fill.log)"
fi
N=$($BENCH size "$BROKERS" "$INPUT")
log "input: $N records in topic $INPUT (4 partitions, $KEYS keys)"

JAR_ID=$(curl -sS --max-time 120 -X POST -F "jarfile=@$JOB_JAR" "$FLINK_REST/jars/upload" |
  python3 -c 'import sys,json; print(json.load(sys.stdin)["filename"].rsplit("/",1)[-1])') ||
  die "uploading $JOB_JAR to $FLINK_REST failed"

common=(--brokers "$BROKERS" --keys "$KEYS" --workdir "$WORK" --engine-bin "$BIN/streamscale-engine"
  --streamscale-bin "$BIN/streamscale" --flink-rest "$FLINK_REST" --flink-jar-id "$JAR_ID"
  --flink-pid-files "${FLINK_PIDS[@]}")
run() { # run SUBCOMMAND ARGS... -> appends its JSON line to results.jsonl
  local line
  log "$* (load $(cut -d' ' -f1-3 /proc/loadavg))"
  line=$($BENCH "$@" "${common[@]}") || {
    echo "$line" >>"$RESULTS"
    die "run failed: $*"
  }
  echo "$line" | tee -a "$RESULTS" >&2
}

# ---------------------------------------------------------------------------------- 1. throughput
# Each side twice, interleaved (engine first in odd rounds, Flink first in even ones).
for ((r = 1; r <= ROUNDS; r++)); do
  for p in $PARALLELISM; do
    sides="engine flink"
    ((r % 2)) || sides="flink engine"
    for side in $sides; do
      run throughput --side "$side" --input "$INPUT" --output "out-$side-p$p-r$r" \
        --parallelism "$p" --checkpoint-ms 1000 --verify
    done
  done
done

# ---------------------------------------------------------------------------------- 2a. checkpoints
# The engine at parallelism 1 with checkpoints every 1 s and every 10 min (none during the run),
# until its source has emitted every input record (results of the long interval are committed
# only at its next checkpoint).
if ((OVERHEAD)); then
  for ((r = 1; r <= ROUNDS; r++)); do
    for ms in 1000 600000; do
      run throughput --side engine --input "$INPUT" --output "ckpt-$ms-r$r" --parallelism 1 \
        --checkpoint-ms "$ms" --done consumed
    done
  done
fi

# ---------------------------------------------------------------------------------- 2b. latency
if ((LATENCY)); then
  for side in engine flink; do
    run latency --side "$side" --input "lat-in-$side" --output "lat-out-$side" --parallelism 1 \
      --checkpoint-ms 1000 --rate "$LAT_RATE" --duration "$LAT_SECONDS" --warmup 15
  done
fi

echo "commit $COMMIT, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, results in $RESULTS"
$PY "$HERE/bench.py" summary "$RESULTS"
