#!/usr/bin/env bash
# Acceptance tables of issue 6 (planner depth) in the simulator, on the bundled traces
# (examples/traces/**.rate.csv), job examples/sim/six-ops.yaml, fast mode, default settings
# (streamscale with the Kubernetes operator's defaults), step 10 s.
#
# 1. Step changes: for each bundled trace, its median and 99th-percentile rates (scaled so that
#    the p99 is P99 records/s) as a two-level step: 500 s at the median, 700 s at the p99,
#    700 s at the median again (step 1 s, every step a row of the time series). Counts streamscale's rescales after each step until
#    the last one of that level (decisions to reach the final parallelism) and checks that the
#    final parallelism is what it was before the step up (down-step) and stays put.
# 2. Per trace: resource-hours and SLO-violation time of streamscale against flink and threshold
#    (and streamscale-forecast when the simulator has it), and rescales per simulated day.
#    Traces replayed in real time (speedup 1, so a day is a day), the first DAYS days (default 28)
#    of each.
# Usage: simulations/scripts/acceptance.sh [P99] [DAYS]   (from the repository root)
set -euo pipefail
P99=${1:-300}
DAYS=${2:-28}
SIM=${SIM:-./target/release/streamscale-sim}
[ -x "$SIM" ] || cargo build --release -p streamscale-simulations >&2
OUT=${OUT:-$(mktemp -d)}
KEEP=${KEEP:-0}
[ "$KEEP" = 1 ] || trap 'rm -rf "$OUT"' EXIT
mkdir -p "$OUT"
# Diurnal traces (a strong daily cycle, see ../shared/traces/README.md).
DIURNAL="nab/realKnownCause/nyc_taxi.rate.csv prophet/example_pedestrians_location4.rate.csv slo-power/wikipedia_full_trace.rate.csv"
POLICIES=streamscale,flink,threshold
if "$SIM" --help | grep -q . && "$SIM" examples/sim/six-ops.yaml --policy streamscale-forecast \
  --duration 1 --quiet > /dev/null 2>&1; then
  POLICIES=streamscale,streamscale-forecast,flink,threshold
fi

stats() { # trace -> "scale median p99" (nearest-rank order statistics of the trace's rates)
  python3 - "$1" "$P99" <<'PY'
import math, sys
r = sorted(float(l.split(",")[1]) for l in open(sys.argv[1]).read().split()[1:])
q = lambda x: r[max(1, math.ceil(x * len(r))) - 1]
scale = float(sys.argv[2]) / q(0.99) if q(0.99) > 0 else 1.0
print(f"{scale:.9g} {q(0.5) * scale:.6g} {q(0.99) * scale:.6g}")
PY
}

echo "### Step changes (one decision to the final parallelism)"
echo
echo "| trace | levels (records/s) | decisions after the step up | after the step down | back to the first parallelism | SLO violation |"
echo "|---|---|---|---|---|---|"
find examples/traces -name '*.rate.csv' | sort | while read -r f; do
  read -r _ lo hi < <(stats "$f")
  name=${f#examples/traces/}
  step="$OUT/step-$(basename "$f" .rate.csv)"
  mkdir -p "$step"
  python3 - "$lo" "$hi" > "$step/trace.csv" <<'PY'
import sys
lo, hi = float(sys.argv[1]), float(sys.argv[2])
print("t_seconds,rate")
for t in range(0, 1900, 50):
    print(f"{t},{hi if 500 <= t < 1200 else lo}")
PY
  "$SIM" examples/sim/six-ops.yaml --trace "$step/trace.csv" --scale 1 --speedup 1 \
    --policy streamscale --step 1 \
    --report "$step" --quiet > /dev/null
  python3 - "$name" "$lo" "$hi" "$step" <<'PY'
import csv, json, sys
name, lo, hi, d = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = [r for r in csv.DictReader(open(f"{d}/timeseries.csv")) if r["policy"] == "streamscale"]
ops = [k for k in rows[0] if k.startswith("p_")]
par = [(float(r["t_s"]), tuple(int(r[k]) for k in ops)) for r in rows]
def changes(a, b):
    seg = [p for t, p in par if a <= t < b]
    return sum(1 for x, y in zip(seg, seg[1:]) if x != y), seg[-1]
before = [p for t, p in par if t <= 500][-1]
up, _ = changes(500, 1200)
down, last = changes(1200, 1900)
s = json.load(open(f"{d}/summary.json"))["policies"]["streamscale"]
print(f"| {name} | {lo:.1f} → {hi:.1f} → {lo:.1f} | {up} | {down} | "
      f"{'yes' if last == before else f'no ({before} → {last})'} | "
      f"{100 * s['slo_violation_fraction']:.2f}% |")
PY
done

echo
echo "### Resource-hours, SLO-violation time and rescales per day (first $DAYS days, real time)"
echo
if [[ $POLICIES == *forecast* ]]; then
  echo "| trace | streamscale resource-h (vs flink, vs threshold) | SLO violation: streamscale / flink / threshold | fewer resources, no more violation | rescales/day: streamscale / flink | forecast on: resource-h (vs off), SLO violation |"
  echo "|---|---|---|---|---|---|"
else
  echo "| trace | streamscale resource-h (vs flink, vs threshold) | SLO violation: streamscale / flink / threshold | fewer resources, no more violation | rescales/day: streamscale / flink |"
  echo "|---|---|---|---|---|"
fi
find examples/traces -name '*.rate.csv' | sort | while read -r f; do
  read -r scale _ _ < <(stats "$f")
  name=${f#examples/traces/}
  end=$(python3 -c "print(float(open('$f').read().split()[1].split(',')[0]) + $DAYS * 86400)")
  rep="$OUT/days-$(basename "$f" .rate.csv)"
  "$SIM" examples/sim/six-ops.yaml --trace "$f" --scale "$scale" --speedup 1 --start 0 \
    --end "$end" --step 10 --policy "$POLICIES" --report "$rep" --quiet > /dev/null
  diurnal=no
  for d in $DIURNAL; do [ "$d" = "$name" ] && diurnal=yes; done
  python3 - "$name" "$rep/summary.json" "$diurnal" <<'PY'
import json, sys
name, path, diurnal = sys.argv[1], sys.argv[2], sys.argv[3] == "yes"
s = json.load(open(path))
p, days = s["policies"], s["duration_s"] / 86400
ss, fl, th = p["streamscale"], p["flink"], p["threshold"]
v = lambda x: 100 * x["slo_violation_fraction"]
ok = (ss["resource_hours"] < fl["resource_hours"] and ss["resource_hours"] < th["resource_hours"]
      and ss["slo_violation_fraction"] <= fl["slo_violation_fraction"]
      and ss["slo_violation_fraction"] <= th["slo_violation_fraction"])
rd = (f"{ss['rescales'] / days:.1f} / {fl['rescales'] / days:.1f}"
      + (" (diurnal: " + ("fewer" if ss["rescales"] < fl["rescales"] else "**not fewer**") + ")"
         if diurnal else ""))
line = (f"| {name} ({days:.1f} d) | {ss['resource_hours']:.1f} ({ss['resource_hours'] / fl['resource_hours']:.3f}, "
        f"{ss['resource_hours'] / th['resource_hours']:.3f}) | {v(ss):.2f}% / {v(fl):.2f}% / {v(th):.2f}% | "
        f"{'yes' if ok else '**no**'} | {rd} |")
if "streamscale-forecast" in p:
    fc = p["streamscale-forecast"]
    line += (f" {fc['resource_hours']:.1f} ({fc['resource_hours'] / ss['resource_hours']:.3f}), "
             f"{v(fc):.2f}% vs {v(ss):.2f}% |")
print(line)
PY
done
