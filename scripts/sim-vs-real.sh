#!/usr/bin/env bash
# Sim-to-real check (issue 4): the bundled job (examples/jobs/tweets.yaml: four hours of the AAPL
# tweet trace around its news spike) replayed over 10 minutes (speedup 24) by the real engine
# under `streamscale run`, and by the simulator with the same settings (streamscale run's
# interval 1 s, window 10 s, guard history 3 s, stabilization 3 s, scale-down delay 15 s; the
# rescale downtime measured in the real run), in the fast and the event mode. Prints the gap:
# rescales and parallelism timeline, p99 latency error, backlog error. "nominal" uses the job
# file's per-record costs (cpu + io + 5 µs); "calibrated" the service times the real run measured
# (the median of its planner's μ, constant); "replayed" the true processing rates the real run
# measured in every interval (OUT_DIR/real/service_rates.csv, `--service-rates`), over time.
# Each with the simulator's default service-time CV of 1 (exponential) and, suffix "-cv0", with
# fixed per-record service times (CV 0), as the engine spends them (a spin of `cpu` µs and a
# sleep of `io` µs per record; their variation over time is what the replayed rates carry).
# "replayed-cv0-paced" (event mode) also spaces arrivals evenly, as the engine's source emits them
# (nothing random is left). The event-mode replayed variants also run with seeds 2..5 (SEEDS) to
# show the sampling spread.
# Usage: scripts/sim-vs-real.sh [OUT_DIR]   (from the repository root; OUT_DIR default
# target/sim-vs-real). REUSE=1 reuses OUT_DIR/real from an earlier run.
set -euo pipefail
OUT=${1:-target/sim-vs-real}
SPEEDUP=24
JOB=examples/jobs/tweets.yaml
mkdir -p "$OUT"
if [ ! -x target/release/streamscale ] || [ ! -x target/release/streamscale-engine ]; then
  cargo build --release -p streamscale-engine -p streamscale-controller >&2
fi
[ -x target/release/streamscale-sim ] || cargo build --release -p streamscale-simulations >&2
if [ "${REUSE:-0}" != 1 ] || [ ! -f "$OUT/real/summary.json" ]; then
  ./target/release/streamscale run "$JOB" --speedup "$SPEEDUP" --report "$OUT/real" > "$OUT/real.log"
fi
downtime=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["rescales"]
d = [x["downtime_s"] for x in r if x.get("downtime_s") is not None]
print(sum(d) / len(d) if d else 0.6)' "$OUT/real/summary.json")
# Calibrated variant: per-record service times from the true processing rates μ the real run's
# planner measured (median over its decisions, from the RESCALE lines of the log).
service=$(python3 -c '
import re, sys
mu = {}
for m in re.finditer(r"(\w+): DS2: [^;|]*?μ (\d+(?:\.\d+)?) rec/s", open(sys.argv[1]).read()):
    mu.setdefault(m.group(1), []).append(float(m.group(2)))
print(",".join(f"{op}={1e6 / sorted(v)[len(v) // 2]:.0f}" for op, v in sorted(mu.items())))' "$OUT/real.log")
runs=()
sim() { # sim MODE VARIANT SEED
  local mode=$1 variant=$2 seed=$3 extra=() name="sim-$1-$2"
  case "$variant" in calibrated*) [ -n "$service" ] && extra+=(--service "$service") ;; esac
  case "$variant" in replayed*) extra+=(--service-rates "$OUT/real/service_rates.csv") ;; esac
  # "-cv0": fixed per-record service times; "-paced": evenly spaced arrivals (event mode), as
  # the engine's source emits them.
  : > "$OUT/$variant.yaml"
  case "$variant" in *-cv0*)
    printf 'operators:\n' >> "$OUT/$variant.yaml"
    for op in parse enrich counts sink; do printf '  %s: { cv: 0 }\n' "$op" >> "$OUT/$variant.yaml"; done ;;
  esac
  case "$variant" in *-paced) printf 'arrivals: paced\n' >> "$OUT/$variant.yaml" ;; esac
  [ -s "$OUT/$variant.yaml" ] && extra+=(--sim-config "$OUT/$variant.yaml")
  if [ "$seed" != 1 ]; then name="$name-seed$seed"; fi
  ./target/release/streamscale-sim "$JOB" --policy streamscale --speedup "$SPEEDUP" --mode "$mode" \
    --step 1 --interval 1 --window 10 --guard-window 3 --stabilization 3 --scale-down-delay 15 \
    --downtime "$downtime" --seconds-per-mb 0 --engine-p99 --seed "$seed" "${extra[@]}" \
    --report "$OUT/$name" --quiet > /dev/null
  runs+=("$name")
}
for variant in nominal calibrated replayed nominal-cv0 calibrated-cv0 replayed-cv0; do
  for mode in fast event; do sim "$mode" "$variant" 1; done
done
sim event replayed-cv0-paced 1
for seed in ${SEEDS:-2 3 4 5}; do
  for variant in replayed replayed-cv0; do sim event "$variant" "$seed"; done
done
echo "calibrated service times (µs, from the real run's measured μ): ${service:-none}"
# The real service rates move with the load of the machine (CPU contention); the simulator's
# are constant. Their spread per operator over the real run's decisions:
python3 -c '
import re, sys
mu = {}
for m in re.finditer(r"(\w+): DS2: [^;|]*?μ (\d+(?:\.\d+)?) rec/s", open(sys.argv[1]).read()):
    mu.setdefault(m.group(1), []).append(float(m.group(2)))
for op, v in sorted(mu.items()):
    v.sort()
    print(f"real μ {op}: min {v[0]:.0f}, median {v[len(v) // 2]:.0f}, max {v[-1]:.0f} rec/s over {len(v)} decisions")' "$OUT/real.log"
# The same spread per interval (the replayed series; intervals with at least 20 records).
python3 -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for op in list(rows[0])[1:]:
    v = sorted(float(r[op]) for r in rows if r[op])
    if v:
        print(f"real μ {op} per interval: min {v[0]:.0f}, median {v[len(v) // 2]:.0f}, max {v[-1]:.0f} rec/s over {len(v)} of {len(rows)} intervals")' "$OUT/real/service_rates.csv"
python3 - "$OUT" "$downtime" "${runs[@]}" <<'PY'
import csv, json, sys
out, downtime, names = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
real = list(csv.DictReader(open(f"{out}/real/timeline.csv")))
ops = [k[2:] for k in real[0] if k.startswith("p_")]
def num(x):
    return float(x) if x not in ("", None) else None
def series(rows, key):
    return {round(float(r["t_s"])): num(r[key]) for r in rows}
def rescales(rows):
    ev, prev = [], None
    for r in rows:
        p = tuple(int(float(r[f"p_{o}"])) for o in ops if r.get(f"p_{o}") not in ("", None))
        if prev is not None and p != prev:
            ev.append((round(float(r["t_s"])), prev, p))
        prev = p
    return ev
print(f"job examples/jobs/tweets.yaml, 600 s (speedup 24); rescale downtime {downtime:.2f} s (mean of the real run)")
print(f"operators: {', '.join(ops)}")
rr = rescales(real)
print(f"real: {len(rr)} rescales: " + "; ".join(f"t={t}s {a}->{b}" for t, a, b in rr))
table = []
for name in names:
    mode = name[len("sim-"):]
    sim = [r for r in csv.DictReader(open(f"{out}/{name}/timeseries.csv")) if r["policy"] == "streamscale"]
    sr = rescales(sim)
    print(f"\n{mode}: {len(sr)} rescales: " + "; ".join(f"t={t}s {a}->{b}" for t, a, b in sr))
    pr = {o: series(real, f"p_{o}") for o in ops}
    ps = {o: series(sim, f"p_{o}") for o in ops}
    worst = {o: max(abs(pr[o][t] - ps[o][t]) for t in pr[o] if t in ps[o] and pr[o][t] is not None) for o in ops}
    maxr = {o: max(v for v in pr[o].values() if v is not None) for o in ops}
    maxs = {o: max(v for v in ps[o].values() if v is not None) for o in ops}
    print("  peak parallelism real/sim: " + ", ".join(f"{o} {maxr[o]:.0f}/{maxs[o]:.0f}" for o in ops))
    print("  largest same-second parallelism difference: " + ", ".join(f"{o} {worst[o]:.0f}" for o in ops))
    # The same decisions a few seconds apart: the smallest difference within ±3 s, worst over time.
    def near_diff(o, t):
        return min(abs(pr[o][t] - ps[o][u]) for u in range(t - 3, t + 4) if ps[o].get(u) is not None)
    shifted = {o: max(near_diff(o, t) for t in pr[o] if pr[o][t] is not None
                      and any(ps[o].get(u) is not None for u in range(t - 3, t + 4))) for o in ops}
    print("  largest parallelism difference allowing ±3 s of timing: " + ", ".join(f"{o} {shifted[o]:.0f}" for o in ops))
    lr = series(real, "p99_s")
    srt = lambda v: sorted(v)[len(v) // 2]
    # "exact": the simulator's own p99 of the step; "engine": the same latencies read through
    # the engine's histogram buckets and the controller's interpolation, as the real p99 is.
    # "all": each run's per-second p99 over its own seconds (a rescale's latency spike shows a
    # second later in the real run, whose first scrape after the restart has no sink output yet,
    # so aligning seconds would pair the real spike with an ordinary simulated second);
    # "between rescales": the seconds both runs have, more than 3 s after any rescale of either.
    near = {t + k for t, _, _ in rr + sr for k in range(0, 4)}
    p99 = {}
    first, last = min(lr), max(lr)
    for label, col in (("exact", "p99_s"), ("engine", "p99_engine_s")):
        ls = series(sim, col)
        own_r = [v for v in lr.values() if v is not None]
        own_s = [v for t, v in ls.items() if v is not None and first <= t <= last]
        if not own_s:
            continue
        quiet = [t for t in lr if lr[t] is not None and ls.get(t) is not None and t not in near]
        for what, a, b in (("all", own_r, own_s),
                           ("between rescales", [lr[t] for t in quiet], [ls[t] for t in quiet])):
            mr, ms = sum(a) / len(a), sum(b) / len(b)
            medr, meds = srt(a), srt(b)
            print(f"  p99 ({label}, {what}: {len(a)} / {len(b)} s): mean real {mr*1000:.1f} ms, sim {ms*1000:.1f} ms ({(ms-mr)/mr*100:+.0f} %); "
                  f"median real {medr*1000:.1f} ms, sim {meds*1000:.1f} ms ({(meds-medr)/medr*100:+.0f} %)")
            if label == "engine":
                p99[what] = (ms, (ms - mr) / mr * 100, meds, (meds - medr) / medr * 100)
    br, bs = series(real, "backlog"), series(sim, "backlog")
    bt = [t for t in br if br[t] is not None and bs.get(t) is not None]
    mae = sum(abs(br[t] - bs[t]) for t in bt) / len(bt)
    nz = lambda b: sum(1 for t in bt if b[t] >= 10)
    print(f"  source backlog over {len(bt)} s: mean real {sum(br[t] for t in bt)/len(bt):.1f} / sim {sum(bs[t] for t in bt)/len(bt):.1f} records, "
          f"max real {max(br[t] for t in bt):.0f} / sim {max(bs[t] for t in bt):.0f} records, "
          f"seconds with >= 10 records real {nz(br)} / sim {nz(bs)}, mean absolute error {mae:.1f} records")
    table.append((mode, len(sr), shifted, p99, max(bs[t] for t in bt), nz(bs), mae))
# One line per simulation, for BENCHMARKS.md.
lr = [v for v in series(real, "p99_s").values() if v is not None]
br = [v for v in series(real, "backlog").values() if v is not None]
gaps = " / ".join(o for o in ops if o not in ("source", "sink"))
print(f"\n| run | rescales | worst gap ±3 s ({gaps}) | engine-read p99 mean, median: all (vs real) | between rescales (vs real) | backlog max, s ≥ 10, MAE |")
print("|---|---|---|---|---|---|")
print(f"| real | {len(rr)} | — | {sum(lr)/len(lr)*1000:.1f} ms, {sorted(lr)[len(lr)//2]*1000:.1f} ms | — | {max(br):.0f}, {sum(1 for b in br if b >= 10)}, — |")
for mode, n, shifted, p99, bmax, bn, mae in table:
    g = " / ".join(f"{shifted[o]:.0f}" for o in ops if o not in ("source", "sink"))
    a, q = p99.get("all"), p99.get("between rescales")
    fa = f"{a[0]*1000:.1f} ms ({a[1]:+.0f} %), {a[2]*1000:.1f} ms ({a[3]:+.0f} %)" if a else "—"
    fq = f"{q[1]:+.0f} %, {q[3]:+.0f} %" if q else "—"
    print(f"| {mode} | {n} | {g} | {fa} | {fq} | {bmax:.0f}, {bn}, {mae:.1f} |")
PY
