#!/usr/bin/env bash
# Downtime of `streamscale flink`'s two ways of applying a decision to a real Flink 2.3 job, on the
# same job and state size: in place (PUT /jobs/<id>/resource-requirements, adaptive scheduler) and
# savepoint + resubmit (stop-with-savepoint, POST /jars/<jar>/run from it with the overrides).
#
# Per state size (KEYS): a fresh loopback cluster (scripts/flink-testenv.sh, adaptive scheduler),
# the demo job (flink-jobs/trace-job) at a constant RATE with KEYS keys, warmed for WARM seconds
# (every key counted), then ROUNDS times: in place 1 -> 2, in place 2 -> 1, savepoint 1 -> 2,
# savepoint 2 -> 1. Each rescale is one `streamscale flink` session whose settings pin the keyed
# vertex at the target (min = max), so its first decision asks for it; the downtime is the
# session's own measure (summary.json `downtimeSeconds`: the request until every vertex runs at the
# new parallelism and records flow again), the savepoint's size `du` of its directory.
#
#   cargo build --release && bench/flink-rescale-paths/run.sh
#
# Env: KEYS ("1000 1000000"), RATE (20000 rec/s), COST_US (20 µs per record), WARM (90 s),
#      SESSION (45s: a job restored from a large savepoint needs ~10 s before its metrics are complete),
#      ROUNDS (2), STREAMSCALE_BIN (target/release/streamscale), BENCH_WORK (~/.cache/streamscale/bench-flink-rescale-paths).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
KEYS=${KEYS:-"1000 1000000"}
RATE=${RATE:-20000}
COST_US=${COST_US:-20}
WARM=${WARM:-90}
SESSION=${SESSION:-45s}
ROUNDS=${ROUNDS:-2}
W=${BENCH_WORK:-$HOME/.cache/streamscale/bench-flink-rescale-paths}
BIN=${STREAMSCALE_BIN:-$ROOT/target/release/streamscale}
REST=http://127.0.0.1:8081
VERTEX="count -> discard: Writer"

log() { echo "bench-flink-rescale-paths: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
[[ -x "$BIN" ]] || die "$BIN missing; run 'cargo build --release' first"
trap './scripts/flink-testenv.sh stop >/dev/null 2>&1 || true' EXIT
./scripts/flink-testenv.sh install
rm -rf "$W"
mkdir -p "$W"
RESULTS=$W/results.csv
echo "keys,round,path,from,to,downtime_s,savepoint_bytes,outcome,load1" >"$RESULTS"

# One session: pin the keyed vertex at $to by PATH (in-place | savepoint); prints the job id after.
rescale() { # JID PATH FROM TO KEYS ROUND
  local jid=$1 path=$2 from=$3 to=$4 keys=$5 round=$6 d
  d="$W/k$keys-r$round-$path-$from-$to"
  mkdir -p "$d"
  printf 'vertices:\n  "%s": { min: %s, max: %s }\n' "$VERTEX" "$to" "$to" >"$d/settings.yaml"
  local extra=()
  if [[ $path == savepoint ]]; then
    local jar
    jar=$(curl -fs "$REST/jars" | python3 -c 'import sys,json; print(json.load(sys.stdin)["files"][0]["id"])')
    extra=(--rescale savepoint --resubmit-jar "$jar" --entry-class streamscale.tracejob.TraceJob
      --savepoint-dir "file://$W/savepoints")
    for a in "${JOB_ARGS[@]}"; do extra+=(--arg "$a"); done
  else
    extra=(--rescale in-place)
  fi
  "$BIN" flink --rest-url "$REST" --job "$jid" --duration "$SESSION" --interval 2 --window 10 \
    --stabilization 4 --scale-down-delay 2 --settings "$d/settings.yaml" "${extra[@]}" \
    --report "$d/report" >"$d/streamscale.log" 2>&1 || die "streamscale flink failed; see $d/streamscale.log"
  if python3 - "$d/report/summary.json" "$keys" "$round" "$path" "$from" "$to" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS" <<'EOF'
import json, os, subprocess, sys
summary, keys, rnd, path, frm, to, load = sys.argv[1:]
job = json.load(open(summary))["jobs"][0]
done = [r for r in job["rescales"] if r["outcome"] == "rescaled"]
if len(done) != 1:
    sys.exit(f"{summary}: expected one rescale, got {job['rescales']}")
r = done[0]
size = ""
if r.get("savepoint"):
    p = r["savepoint"].removeprefix("file:")
    size = subprocess.run(["du", "-sb", p], capture_output=True, text=True).stdout.split()[0]
print(f"{keys},{rnd},{path},{frm},{to},{r['downtimeSeconds']:.3f},{size},{r['outcome']},{load}")
EOF
  then :; else die "no rescale in $d (see streamscale.log there)"; fi
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["jobId"])' "$d/report/summary.json"
}

for keys in $KEYS; do
  ./scripts/flink-testenv.sh stop >/dev/null 2>&1 || true
  FLINK_EXTRA_CONFIG=$'metrics.fetcher.update-interval: 1000\nrest.cache.execution-graph.timeout: 0s' \
    ./scripts/flink-testenv.sh start --scheduler adaptive >"$W/cluster-$keys.log" 2>&1 ||
    die "cluster start failed; see $W/cluster-$keys.log"
  JOB_ARGS=(--rate "$RATE" --keys "$keys" --cost-us "$COST_US" --epoch-ms "$(date +%s%3N)")
  jid=$(./scripts/flink-testenv.sh submit "${JOB_ARGS[@]}" | tail -1)
  log "keys $keys: job $jid, warming $WARM s"
  sleep "$WARM"
  for round in $(seq 1 "$ROUNDS"); do
    jid=$(rescale "$jid" in-place 1 2 "$keys" "$round")
    [[ -n "$jid" ]] || die "a rescale failed (see the folders under $W)"
    jid=$(rescale "$jid" in-place 2 1 "$keys" "$round")
    [[ -n "$jid" ]] || die "a rescale failed (see the folders under $W)"
    jid=$(rescale "$jid" savepoint 1 2 "$keys" "$round")
    [[ -n "$jid" ]] || die "a rescale failed (see the folders under $W)"
    jid=$(rescale "$jid" savepoint 2 1 "$keys" "$round")
    [[ -n "$jid" ]] || die "a rescale failed (see the folders under $W)"
    log "keys $keys round $round done"
  done
done

python3 - "$RESULTS" <<'EOF' | tee "$W/table.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| keys | savepoint size | path | 1 -> 2 downtime (s) | 2 -> 1 downtime (s) | median | load |")
print("|---:|---:|---|---|---|---:|---|")
for keys in dict.fromkeys(r["keys"] for r in rows):
    sizes = [int(r["savepoint_bytes"]) for r in rows if r["keys"] == keys and r["savepoint_bytes"]]
    size = f"{statistics.median(sizes) / 1e6:.1f} MB" if sizes else ""
    for path in ("in-place", "savepoint"):
        sel = [r for r in rows if r["keys"] == keys and r["path"] == path]
        up = " / ".join(r["downtime_s"] for r in sel if r["to"] == "2")
        down = " / ".join(r["downtime_s"] for r in sel if r["to"] == "1")
        med = statistics.median(float(r["downtime_s"]) for r in sel)
        loads = sorted(float(r["load1"]) for r in sel)
        print(f"| {keys} | {size} | {path} | {up} | {down} | {med:.2f} | {loads[0]:.1f}–{loads[-1]:.1f} |")
EOF
log "table in $W/table.md, per-rescale rows in $RESULTS"
