#!/usr/bin/env bash
# streamscale autoscaling a real Apache Flink job, end to end on one machine:
#   1. installs Flink 2.3 (from PyPI, cached) and starts a local session cluster
#      (scripts/flink-testenv.sh: 1 JobManager, 1 TaskManager with 4 slots, adaptive scheduler);
#   2. submits the demo job (flink-jobs/trace-job: a source that follows the AAPL tweet trace,
#      keyed by tweet key into a counter that costs 300 µs per record, into a discarding sink);
#   3. runs `streamscale flink` against it for DURATION (default 6m), which rescales the keyed
#      vertex in place as the trace's news spike comes and goes, and writes report-flink/.
# Run it after `cargo build --release`. KEEP=1 leaves the cluster and the job running.
# Env: DURATION (6m), REPORT (report-flink), SPEEDUP (40 trace-seconds per second), SCALE (130).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./target/release/streamscale
[[ -x "$BIN" ]] || { echo "flink-demo: $BIN is missing; run 'cargo build --release' first" >&2; exit 1; }
DURATION=${DURATION:-6m}
REPORT=${REPORT:-report-flink}
TRACE=$PWD/examples/traces/Twitter_volume_AAPL.rate.csv

./scripts/flink-testenv.sh install
./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true
# Flink refreshes the metrics its REST API serves every 10 s by default; 2 s here so that the
# demo reacts within its few minutes (streamscale dates every sample by Flink's fetch either way).
FLINK_EXTRA_CONFIG="metrics.fetcher.update-interval: 2000" ./scripts/flink-testenv.sh start
cleanup() {
  if [[ "${KEEP:-0}" == 1 ]]; then
    echo "flink-demo: KEEP=1: the cluster runs on; stop it with scripts/flink-testenv.sh stop"
  else
    ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# Four hours of the trace around its largest spike (trace seconds 2779200-2793600), 40x faster.
JOB=$(./scripts/flink-testenv.sh submit --trace "$TRACE" --trace-start 2779200 \
  --speedup "${SPEEDUP:-40}" --scale "${SCALE:-130}" --cost-us 300 --keys 1000 | tail -1)
echo "flink-demo: submitted job $JOB (Flink's web UI: http://127.0.0.1:8081/#/job/running/$JOB/overview)"

# The trace plays 40x faster than real time, and the scale-down lookback runs on the wall clock
# (unset, 120 s per second of measured rescale downtime: minutes, hours of this trace): 60 s
# here, so that the job comes back down within the demo once the spike has passed.
mkdir -p "$REPORT"
SETTINGS="$REPORT/demo-settings.yaml"
printf 'autoscaler: { scaleDownLookbackSeconds: 60 }\n' > "$SETTINGS"

"$BIN" flink --rest-url http://127.0.0.1:8081 --job "$JOB" --duration "$DURATION" \
  --interval 4 --window 40 --stabilization 20 --scale-down-delay 60 --settings "$SETTINGS" \
  --report "$REPORT"

echo "flink-demo: report in $REPORT/ (timeline.png: the sources' output, parallelism, busy share and backlog over the run; summary.json: every rescale with its reason and downtime; timeline.csv: per vertex and interval)"
