#!/usr/bin/env bash
# streamscale vs Apache Flink's own (standalone) autoscaler, on a real local Flink 2.3 session cluster.
# See README.md in this folder. Every run: fresh cluster, the demo job (flink-jobs/trace-job) at
# parallelism 1 on the same trace, ONE autoscaler, and an independent REST sampler (sample.py).
#
# Env:
#   MODES            "same defaults" (default) - which pairs to run, in order
#   DURATION         seconds per run (default 420)
#   TRACE, TRACE_START, SPEEDUP, SCALE, COST_US   the job's schedule (defaults below)
#   AUTOSCALER_DIR   folder with flink-autoscaler-standalone-*.jar and conf/
#                    (default /work/shared/recipes/flink-autoscaler-standalone)
#   BENCH_WORK       work dir (default ~/.cache/streamscale/bench-flink-autoscaler)
#   KEEP_RESULTS=1   keep results/*.json of earlier invocations (the table lists all of them)
#   STAGGER          unset: the two runs of a mode one after the other; S: Flink's autoscaler's run
#                    starts S seconds after streamscale's, both at once on two clusters (for runs
#                    longer than the traffic's busy part; keep S past the busy part, or both
#                    clusters share the CPU while it matters)
#   WHO              "streamscale flink" (default): which autoscalers' runs
# Each autoscaler's run has a cluster of its own: REST SS_REST_PORT / FA_REST_PORT (8091 / 8092),
# FLINK_PORT_BASE SS_PORT_BASE / FA_PORT_BASE (7121 / 7131), FLINK_RUN_DIR
# $BENCH_WORK/cluster-<autoscaler>.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/flink-autoscaler"
cd "$ROOT"
MODES=${MODES:-"same defaults"}
DURATION=${DURATION:-420}
TRACE=${TRACE:-$ROOT/examples/traces/Twitter_volume_AAPL.rate.csv}
TRACE_START=${TRACE_START:-2783400}
SPEEDUP=${SPEEDUP:-10}
SCALE=${SCALE:-167}
COST_US=${COST_US:-300}
AS=${AUTOSCALER_DIR:-/work/shared/recipes/flink-autoscaler-standalone}
W=${BENCH_WORK:-$HOME/.cache/streamscale/bench-flink-autoscaler}
BIN=$ROOT/target/release/streamscale
INTERVAL=10 # streamscale's scrape interval = the Flink autoscaler's control-loop interval (10 s)

log() { echo "bench-flink-autoscaler: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

AS_JAR=$(compgen -G "$AS/flink-autoscaler-standalone-*.jar" | head -1 || true)
[[ -n "$AS_JAR" && -f "$AS_JAR" ]] || die "no flink-autoscaler-standalone-*.jar in $AS (set AUTOSCALER_DIR)"
[[ -f "$AS/conf/config.yaml" && -f "$AS/conf/log4j2.properties" ]] || die "$AS/conf/config.yaml or log4j2.properties missing"
[[ -x "$BIN" ]] || die "$BIN missing; run 'cargo build --release' first"
[[ -f "$TRACE" ]] || die "trace $TRACE missing"
mkdir -p "$W/results"
[[ "${KEEP_RESULTS:-0}" == 1 ]] || rm -f "$W"/results/*.json

EXTRA=$'metrics.fetcher.update-interval: 2000\nrest.cache.execution-graph.timeout: 0s'

side_env() { # WHO: this autoscaler's cluster (exported for flink-testenv.sh) and REST
  case "$1" in
    streamscale) export FLINK_REST_PORT=${SS_REST_PORT:-8091} FLINK_PORT_BASE=${SS_PORT_BASE:-7121} ;;
    flink) export FLINK_REST_PORT=${FA_REST_PORT:-8092} FLINK_PORT_BASE=${FA_PORT_BASE:-7131} ;;
  esac
  export FLINK_RUN_DIR="$W/cluster-$1"
  REST=http://127.0.0.1:$FLINK_REST_PORT
}
RUNS=""
cleanup() {
  local p who
  for p in $RUNS; do kill "$p" 2>/dev/null || true; done
  for who in streamscale flink; do (side_env "$who" && ./scripts/flink-testenv.sh stop >/dev/null 2>&1) || true; done
}
trap cleanup EXIT

./scripts/flink-testenv.sh install

# streamscale's settings: the keyed vertex within the TaskManager's 4 slots (as the Flink
# autoscaler's job.autoscaler.vertex.max-parallelism: 4), everything else its defaults.
cat >"$W/streamscale-settings.yaml" <<'EOF'
vertices:
  "count -> discard: Writer": {max: 4}
EOF

# Per mode: streamscale flags, Flink autoscaler command-line overrides (win over conf/config.yaml).
ss_flags() {
  case "$1" in
    defaults) echo "--interval $INTERVAL" ;; # window 60, stabilization 30, scale-down-delay 60
    same) echo "--interval $INTERVAL --window 60 --stabilization 60 --scale-down-delay 60" ;;
  esac
}
fa_flags() {
  case "$1" in
    defaults) echo "" ;; # the recipe: window 1m, stabilization 1m, scale-down.interval 1h
    same) echo "--job.autoscaler.metrics.window 1m --job.autoscaler.stabilization.interval 1m --job.autoscaler.scale-down.interval 1m" ;;
  esac
}

run_one() { # MODE WHO; run in a subshell (its own cluster, processes and EXIT trap)
  local mode=$1 who=$2 d="$W/$1-$2" epoch jid
  AS_PID="" SS_PID="" SAMPLER_PID=""
  side_env "$who"
  trap 'for p in $SAMPLER_PID $SS_PID $AS_PID; do kill "$p" 2>/dev/null || true; done; ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true' EXIT
  rm -rf "$d"
  mkdir -p "$d"
  ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true
  FLINK_EXTRA_CONFIG="$EXTRA" ./scripts/flink-testenv.sh start >"$d/cluster-start.log" 2>&1 ||
    die "cluster start failed, see $d/cluster-start.log"
  echo "$(date -u +%FT%TZ) $(uptime)" | tee "$d/uptime.txt" >&2
  if [[ $who == flink ]]; then
    # shellcheck disable=SC2046
    FLINK_CONF_DIR="$AS/conf" java -Xmx512m -Dlog4j.configurationFile="$AS/conf/log4j2.properties" \
      -Dautoscaler.log.file="$d/autoscaler.log" -jar "$AS_JAR" $(fa_flags "$mode") \
      --autoscaler.standalone.fetcher.flink-cluster.port "$FLINK_REST_PORT" >"$d/autoscaler.stdout" 2>&1 &
    AS_PID=$!
    for _ in $(seq 1 60); do
      grep -q "standalone autoscaler is started" "$d/autoscaler.log" 2>/dev/null && break
      kill -0 "$AS_PID" 2>/dev/null || die "the Flink autoscaler exited; see $d/autoscaler.stdout"
      sleep 0.5
    done
  fi
  epoch=$(date +%s%3N)
  jid=$(./scripts/flink-testenv.sh submit --trace "$TRACE" --trace-start "$TRACE_START" --speedup "$SPEEDUP" \
    --scale "$SCALE" --cost-us "$COST_US" --keys 1000 --epoch-ms "$epoch" | tail -1)
  echo "$jid" >"$d/job-id"
  # streamscale gives up on a job that is not RUNNING yet: wait for it (both runs alike)
  for _ in $(seq 1 120); do
    curl -fs "$REST/jobs/$jid" | python3 -c 'import sys,json; d=json.load(sys.stdin); sys.exit(0 if d["state"]=="RUNNING" and all(v["status"]=="RUNNING" for v in d["vertices"]) else 1)' && break
    sleep 0.5
  done
  log "$mode/$who: job $jid, epoch $epoch, $DURATION s"
  python3 "$HERE/sample.py" sample --rest "$REST" --job "$jid" --seconds "$DURATION" --out "$d/samples.csv" &
  SAMPLER_PID=$!
  if [[ $who == streamscale ]]; then
    # shellcheck disable=SC2046
    "$BIN" flink --rest-url "$REST" --job "$jid" --duration "${DURATION}s" $(ss_flags "$mode") \
      --settings "$W/streamscale-settings.yaml" --report "$d/report" >"$d/streamscale.log" 2>&1 &
    SS_PID=$!
  fi
  wait "$SAMPLER_PID" || true
  SAMPLER_PID=""
  if [[ -n "$SS_PID" ]]; then
    for _ in $(seq 1 40); do kill -0 "$SS_PID" 2>/dev/null || break; sleep 0.5; done
    kill "$SS_PID" 2>/dev/null || true
    wait "$SS_PID" 2>/dev/null || true
    SS_PID=""
  fi
  if [[ -n "$AS_PID" ]]; then
    kill "$AS_PID" 2>/dev/null || true
    wait "$AS_PID" 2>/dev/null || true
    AS_PID=""
  fi
  curl -s -X PATCH "$REST/jobs/$jid?mode=cancel" >/dev/null || true
  ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true
  python3 "$HERE/sample.py" summarise --samples "$d/samples.csv" --trace "$TRACE" --trace-start "$TRACE_START" \
    --speedup "$SPEEDUP" --scale "$SCALE" --epoch-ms "$epoch" --label "$mode/$who" >"$W/results/$mode-$who.json"
  log "$mode/$who: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ("slot_seconds","rescales","downtimes","lag_growing_s","backlog_over_5s_s","max_backlog")})' "$W/results/$mode-$who.json")"
}

[[ -z "${STAGGER:-}" || "${STAGGER:-}" =~ ^[0-9]+$ ]] || die "STAGGER must be a number of seconds, not '$STAGGER'"
WHO=${WHO:-streamscale flink}
for who in $WHO; do [[ $who == streamscale || $who == flink ]] || die "unknown autoscaler $who in WHO (streamscale | flink)"; done
for mode in $MODES; do
  [[ $mode == same || $mode == defaults ]] || die "unknown mode $mode (same | defaults)"
  if [[ -z "${STAGGER:-}" || "$WHO" != "streamscale flink" ]]; then
    for who in $WHO; do (run_one "$mode" "$who"); done
  else
    (run_one "$mode" streamscale) &
    RUNS="$!"
    sleep "$STAGGER"
    (run_one "$mode" flink) &
    RUNS="$RUNS $!"
    for p in $RUNS; do wait "$p" || die "a run of mode $mode failed"; done
    RUNS=""
  fi
done

python3 "$HERE/sample.py" table "$W"/results/*.json | tee "$W/table.md"
log "table in $W/table.md; per-run samples, logs and reports under $W/<mode>-<autoscaler>/"
