#!/usr/bin/env bash
# Per-trace comparison table of BENCHMARKS.md: every bundled trace (examples/traces/**.rate.csv)
# through the 6-operator job examples/sim/six-ops.yaml under every policy, fast mode, default
# settings. Each trace is scaled so that its 99th-percentile rate is P99 records/s (default 300)
# and replayed over at most DAYS simulated days (default 7; shorter traces in real time).
# Usage: simulations/scripts/trace-table.sh [P99] [DAYS]   (from the repository root)
set -euo pipefail
P99=${1:-300}
DAYS=${2:-7}
SIM=./target/release/streamscale-sim
[ -x "$SIM" ] || cargo build --release -p streamscale-simulations >&2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "| trace | policy | resource-h | vs oracle | SLO violation | rescales | downtime s |"
echo "|---|---|---|---|---|---|---|"
find examples/traces -name '*.rate.csv' | sort | while read -r f; do
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
  rep="$OUT/$(basename "$f" .rate.csv)"
  "$SIM" examples/sim/six-ops.yaml --trace "$f" --scale "$scale" --speedup "$speedup" \
    --report "$rep" --quiet > /dev/null
  python3 - "$f" "$rep/summary.json" <<'PY'
import json, sys
f, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
name = f.replace("examples/traces/", "")
for p in ["streamscale", "ds2", "flink", "threshold", "static", "oracle"]:
    x = s["policies"][p]
    print(f"| {name} | {p} | {x['resource_hours']:.1f} | {x['resource_vs_oracle']:.3f} | "
          f"{100 * x['slo_violation_fraction']:.2f}% | {x['rescales']:.0f} | {x['downtime_s']:.1f} |")
PY
done
