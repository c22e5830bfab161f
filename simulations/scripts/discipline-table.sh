#!/usr/bin/env bash
# Rescale discipline tables (issue 22): on every bundled trace (examples/traces/**.rate.csv, the
# synthetic noisy ones included), job examples/sim/six-ops.yaml, fast mode, default settings,
# step 10 s, the first DAYS days in real time scaled to a p99 of P99 records/s, at a downtime of
# 0.6 s and of 10 s per rescale: streamscale against flink, threshold and the oracle.
# A row passes when streamscale has fewer rescales than flink, no more SLO-violation time and
# no more resource-hours than flink, and at most 1.05x the oracle's resource-hours.
# Usage: simulations/scripts/discipline-table.sh [P99] [DAYS]   (from the repository root)
# SIM= another simulator binary; JOB= another job; OUT=DIR KEEP=1 keep the reports; DOWNTIMES="0.6 10".
set -euo pipefail
P99=${1:-300}
DAYS=${2:-28}
SIM=${SIM:-./target/release/streamscale-sim}
JOB=${JOB:-examples/sim/six-ops.yaml}
[ -x "$SIM" ] || cargo build --release -p streamscale-simulations >&2
OUT=${OUT:-$(mktemp -d)}
KEEP=${KEEP:-0}
DOWNTIMES=${DOWNTIMES:-0.6 10}
[ "$KEEP" = 1 ] || trap 'rm -rf "$OUT"' EXIT
mkdir -p "$OUT"

scale_of() { # trace -> factor that makes its nearest-rank p99 equal P99
  python3 - "$1" "$P99" <<'PY'
import math, sys
r = sorted(float(l.split(",")[1]) for l in open(sys.argv[1]).read().split()[1:])
q = r[max(1, math.ceil(0.99 * len(r))) - 1]
print(f"{float(sys.argv[2]) / q if q > 0 else 1.0:.9g}")
PY
}

for dt in $DOWNTIMES; do
  echo "### Downtime $dt s per rescale (first $DAYS days, real time, p99 $P99 records/s)"
  echo
  echo "| trace | rescales/day: streamscale / flink / threshold | SLO violation: streamscale / flink / threshold | resource-h: streamscale / flink / threshold / oracle | vs oracle | all three vs flink, ≤ 1.05 oracle |"
  echo "|---|---|---|---|---|---|"
  find examples/traces -name '*.rate.csv' | sort | while read -r f; do
    scale=$(scale_of "$f")
    name=${f#examples/traces/}
    end=$(python3 -c "print(float(open('$f').read().split()[1].split(',')[0]) + $DAYS * 86400)")
    rep="$OUT/dt$dt-$(basename "$f" .rate.csv)"
    "$SIM" "$JOB" --trace "$f" --scale "$scale" --speedup 1 --start 0 \
      --end "$end" --step 10 --downtime "$dt" --policy streamscale,flink,threshold,oracle \
      --report "$rep" --quiet > /dev/null
    python3 - "$name" "$rep/summary.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
p, days = s["policies"], s["duration_s"] / 86400
ss, fl, th, orc = p["streamscale"], p["flink"], p["threshold"], p["oracle"]
v = lambda x: 100 * x["slo_violation_fraction"]
r = lambda x: x["resource_hours"]
fails = []
if not ss["rescales"] < fl["rescales"]: fails.append("rescales")
if not ss["slo_violation_fraction"] <= fl["slo_violation_fraction"]: fails.append("violation")
if not r(ss) <= r(fl): fails.append("resources")
if not r(ss) <= 1.05 * r(orc): fails.append("oracle")
print(f"| {name} ({days:.1f} d) | {ss['rescales'] / days:.1f} / {fl['rescales'] / days:.1f} / {th['rescales'] / days:.1f} "
      f"| {v(ss):.3f}% / {v(fl):.3f}% / {v(th):.3f}% "
      f"| {r(ss):.1f} / {r(fl):.1f} / {r(th):.1f} / {r(orc):.1f} | {r(ss) / r(orc):.3f} "
      f"| {'yes' if not fails else '**no** (' + ', '.join(fails) + ')'} |")
PY
  done
  echo
done
