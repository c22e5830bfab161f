#!/usr/bin/env bash
# Forecasting on vs off (BENCHMARKS.md "Forecasting"): the 6-operator job examples/sim/six-ops.yaml
# under `streamscale` and `streamscale-forecast` (the same planner with autoscaler.forecast on), fast
# mode, default settings, on the given traces. Each trace is scaled as in trace-table.sh (99th
# percentile rate = P99 records/s, default 300) and replayed over DAYS simulated days (default 7,
# compressing the trace) or, with SPEEDUP=1 DURATION=S, in real time for S simulated seconds.
# Usage: [P99=300] [DAYS=7] [SPEEDUP=1 DURATION=1209600] simulations/scripts/forecast-table.sh TRACE...
set -euo pipefail
P99=${P99:-300}
DAYS=${DAYS:-7}
SIM=${SIM:-./target/release/streamscale-sim}
[ -x "$SIM" ] || cargo build --release -p streamscale-simulations >&2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "| trace | policy | resource-h | vs off | SLO violation | rescales |"
echo "|---|---|---|---|---|---|"
for f in "$@"; do
  read -r scale speedup < <(python3 - "$f" "$P99" "$DAYS" <<'PY'
import math, sys
rows = [l.split(",") for l in open(sys.argv[1]).read().split()[1:]]
t = [float(r[0]) for r in rows]
r = sorted(float(x[1]) for x in rows)
k = max(1, math.ceil(0.99 * len(r)))
scale = float(sys.argv[2]) / r[k - 1] if r[k - 1] > 0 else 1.0
print(f"{scale:.9g} {max(1.0, (t[-1] - t[0]) / (float(sys.argv[3]) * 86400)):.9g}")
PY
)
  extra=()
  if [ -n "${SPEEDUP:-}" ]; then speedup=$SPEEDUP; fi
  if [ -n "${DURATION:-}" ]; then extra=(--duration "$DURATION"); fi
  rep="$OUT/$(basename "$f" .rate.csv)"
  "$SIM" examples/sim/six-ops.yaml --trace "$f" --scale "$scale" --speedup "$speedup" "${extra[@]}" \
    --policy streamscale,streamscale-forecast --report "$rep" --quiet > /dev/null
  python3 - "$f" "$rep/summary.json" <<'PY'
import json, sys
f, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))["policies"]
off = s["streamscale"]["resource_hours"]
for p in ["streamscale", "streamscale-forecast"]:
    x = s[p]
    print(f"| {f.replace('examples/traces/', '')} | {p} | {x['resource_hours']:.1f} | "
          f"{x['resource_hours'] / off:.3f} | {100 * x['slo_violation_fraction']:.3f}% | {x['rescales']:.0f} |")
PY
done
