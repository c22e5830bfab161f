#!/usr/bin/env bash
# Sim-to-real check (issue 4): the bundled job (examples/jobs/tweets.yaml: four hours of the AAPL
# tweet trace around its news spike) replayed over 10 minutes (speedup 24) by the real engine
# under `streamscale run`, several times with the same settings (RUNS, default "A B C"), and by
# the simulator with the same settings (streamscale run's interval 1 s, window 10 s, guard
# history 3 s, stabilization 3 s, scale-down delay 15 s; each real run's mean rescale downtime),
# in the fast and the event mode, each simulation replaying one real run's measured true
# processing rates (OUT_DIR/real-R/service_rates.csv, `--service-rates`).
#
# Variants (VARIANTS, default "replayed replayed-cv0 replayed-cv0-paced"): "replayed" keeps the
# simulator's default service-time CV of 1 (exponential); suffix "-cv0" uses fixed per-record
# service times (CV 0), as the engine spends them (a spin of `cpu` µs and a sleep of `io` µs per
# record); "-paced" spaces arrivals evenly, as the engine's source emits them (event mode; the
# fast mode takes ca² = 0 at the sources); "nominal" (the job file's per-record costs, constant)
# is the variant without any measurement of the real run. The event mode runs with every seed
# in SEEDS (default "1 2 3 4 5"); the fast mode is deterministic (one run per real run), and so
# is the event mode with "-cv0-paced" (nothing random is left).
#
# Gaps reported (python below):
# - real vs real: every pair of real runs, the noise floor of the comparison;
# - each simulation against the real run whose rates it replays ("paired"), and against the
#   envelope of all real runs ("envelope": at each second the least and the largest parallelism
#   of any real run within ±3 s; the gap is how far the simulation lies outside it);
# - parallelism: the largest difference per operator when either run may be 3 s early or late
#   (symmetric: the worst over both runs' seconds);
# - p99: the engine-read p99 (`--engine-p99`: the same latencies through the engine's histogram
#   buckets and the controller's interpolation), mean and median of each run's own seconds;
# - backlog: mean absolute error per second, records.
# Usage: scripts/sim-vs-real.sh [OUT_DIR]   (from the repository root; OUT_DIR default
# target/sim-vs-real). REUSE=1 reuses OUT_DIR/real-R from earlier runs. BIN (default
# target/release) holds streamscale, streamscale-engine and streamscale-sim.
set -euo pipefail
OUT=${1:-target/sim-vs-real}
SPEEDUP=24
JOB=examples/jobs/tweets.yaml
BIN=${BIN:-target/release}
RUNS=${RUNS:-A B C}
SEEDS=${SEEDS:-1 2 3 4 5}
VARIANTS=${VARIANTS:-replayed replayed-cv0 replayed-cv0-paced}
mkdir -p "$OUT"
if [ "$BIN" = target/release ]; then
  if [ ! -x "$BIN/streamscale" ] || [ ! -x "$BIN/streamscale-engine" ]; then
    cargo build --release -p streamscale-engine -p streamscale-controller >&2
  fi
  [ -x "$BIN/streamscale-sim" ] || cargo build --release -p streamscale-simulations >&2
fi
for r in $RUNS; do
  if [ "${REUSE:-0}" != 1 ] || [ ! -f "$OUT/real-$r/summary.json" ]; then
    echo "real run $r: $(date -u +%H:%M) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    "$BIN/streamscale" run "$JOB" --speedup "$SPEEDUP" --engine "$BIN/streamscale-engine" \
      --report "$OUT/real-$r" > "$OUT/real-$r.log"
  fi
done
sims=()
sim() { # sim REAL MODE VARIANT SEED
  local real=$1 mode=$2 variant=$3 seed=$4 extra=() cfg="$OUT/$3.yaml"
  local name="sim-$real-$mode-$variant-s$seed"
  local downtime
  downtime=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["rescales"]
d = [x["downtime_s"] for x in r if x.get("downtime_s") is not None]
print(sum(d) / len(d) if d else 0.6)' "$OUT/real-$real/summary.json")
  case "$variant" in replayed*) extra+=(--service-rates "$OUT/real-$real/service_rates.csv") ;; esac
  : > "$cfg"
  case "$variant" in *-cv0*)
    printf 'operators:\n' >> "$cfg"
    for op in parse enrich counts sink; do printf '  %s: { cv: 0 }\n' "$op" >> "$cfg"; done ;;
  esac
  case "$variant" in *-paced*) printf 'arrivals: paced\n' >> "$cfg" ;; esac
  [ -s "$cfg" ] && extra+=(--sim-config "$cfg")
  "$BIN/streamscale-sim" "$JOB" --policy streamscale --speedup "$SPEEDUP" --mode "$mode" \
    --step 1 --interval 1 --window 10 --guard-window 3 --stabilization 3 --scale-down-delay 15 \
    --downtime "$downtime" --seconds-per-mb 0 --engine-p99 --seed "$seed" "${extra[@]}" \
    --report "$OUT/$name" --quiet > /dev/null
  sims+=("$name")
}
for r in $RUNS; do
  for variant in $VARIANTS; do
    sim "$r" fast "$variant" 1
    for seed in $SEEDS; do sim "$r" event "$variant" "$seed"; done
  done
done
# The spread of the measured true processing rates per interval, per real run.
for r in $RUNS; do
  python3 -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
out = []
for op in list(rows[0])[1:]:
    v = sorted(float(x[op]) for x in rows if x[op])
    if v:
        out.append(f"{op} {v[0]:.0f}/{v[len(v) // 2]:.0f}/{v[-1]:.0f}")
print(f"real {sys.argv[2]}: μ per interval min/median/max rec/s: " + ", ".join(out))' "$OUT/real-$r/service_rates.csv" "$r"
done
python3 - "$OUT" "$RUNS" "${sims[@]}" <<'PY'
import csv, json, sys
out, reals, names = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
W = 3  # seconds of timing either run may be early or late
def num(x):
    return float(x) if x not in ("", None) else None
def load(path, policy=None):
    rows = [r for r in csv.DictReader(open(path)) if policy is None or r.get("policy") == policy]
    ops = [k[2:] for k in rows[0] if k.startswith("p_")]
    t = lambda r: round(float(r["t_s"]))
    return {
        "ops": ops,
        "p": {o: {t(r): num(r[f"p_{o}"]) for r in rows if num(r[f"p_{o}"]) is not None} for o in ops},
        "p99": {t(r): num(r[policy and "p99_engine_s" or "p99_s"]) for r in rows
                if num(r[policy and "p99_engine_s" or "p99_s"]) is not None},
        "backlog": {t(r): num(r["backlog"]) for r in rows if num(r["backlog"]) is not None},
    }
def rescales(run):
    ops = [o for o in run["p"]]
    ts = sorted(set().union(*[set(run["p"][o]) for o in ops]))
    ev, prev = [], None
    for t in ts:
        p = tuple(int(run["p"][o].get(t, 0)) for o in ops)
        if prev is not None and p != prev:
            ev.append((t, prev, p))
        prev = p
    return ev
def one_way(a, b, o):
    """Largest |a_p(t) − b_p(u)| minimised over u in t ± W, over a's seconds t."""
    pa, pb = a["p"][o], b["p"][o]
    worst = 0
    for t, v in pa.items():
        near = [pb[u] for u in range(t - W, t + W + 1) if u in pb]
        if near:
            worst = max(worst, min(abs(v - x) for x in near))
    return worst
def gap(a, b, ops):
    return {o: max(one_way(a, b, o), one_way(b, a, o)) for o in ops}
def envelope_gap(s, rs, o):
    """How far s lies outside [min, max] of the real runs' parallelism within t ± W."""
    worst = 0
    for t, v in s["p"][o].items():
        near = [r["p"][o][u] for r in rs for u in range(t - W, t + W + 1) if u in r["p"][o]]
        if near:
            worst = max(worst, min(near) - v, v - max(near))
    return worst
def p99_stats(run, first, last):
    v = sorted(x for t, x in run["p99"].items() if first <= t <= last)
    return sum(v) / len(v), v[len(v) // 2]
def backlog_mae(a, b):
    ts = [t for t in a["backlog"] if t in b["backlog"]]
    return sum(abs(a["backlog"][t] - b["backlog"][t]) for t in ts) / len(ts)
R = {r: load(f"{out}/real-{r}/timeline.csv") for r in reals}
ops = R[reals[0]]["ops"]
inner = [o for o in ops if o not in ("source", "sink")]
span = {r: (min(R[r]["p99"]), max(R[r]["p99"])) for r in reals}
fmt_gap = lambda g: " / ".join(f"{g[o]:.0f}" for o in inner)
print(f"job examples/jobs/tweets.yaml, 600 s (speedup 24); gaps per operator: {' / '.join(inner)}")
for r in reals:
    m, med = p99_stats(R[r], *span[r])
    rr = rescales(R[r])
    dt = [x["downtime_s"] for x in json.load(open(f"{out}/real-{r}/summary.json"))["rescales"]]
    print(f"real {r}: {len(rr)} rescales (downtime mean {sum(dt)/max(len(dt),1):.2f} s): "
          + "; ".join(f"t={t}s " + ",".join(f"{o} {a[k]}→{b[k]}" for k, o in enumerate(ops) if a[k] != b[k]) for t, a, b in rr))
    print(f"  p99 mean {m*1000:.1f} ms, median {med*1000:.1f} ms")
print("\n| real vs real | worst gap ±3 s | p99 mean, median (2nd vs 1st) | backlog MAE |")
print("|---|---|---|---|")
for i, a in enumerate(reals):
    for b in reals[i + 1:]:
        g = gap(R[a], R[b], inner)
        ma, meda = p99_stats(R[a], *span[a])
        mb, medb = p99_stats(R[b], *span[b])
        print(f"| {a} vs {b} | {fmt_gap(g)} | {(mb-ma)/ma*100:+.0f} %, {(medb-meda)/meda*100:+.0f} % | {backlog_mae(R[a], R[b]):.1f} |")
rows = []
for name in names:
    _, real, mode, rest = name.split("-", 3)
    variant, seed = rest.rsplit("-s", 1)
    S = load(f"{out}/{name}/timeseries.csv", "streamscale")
    g = gap(R[real], S, inner)
    env = {o: envelope_gap(S, [R[r] for r in reals], o) for o in inner}
    mr, medr = p99_stats(R[real], *span[real])
    ms, meds = p99_stats(S, *span[real])
    rows.append(dict(real=real, mode=mode, variant=variant, seed=int(seed), n=len(rescales(S)),
                     gap=g, env=env, p99=((ms - mr) / mr, (meds - medr) / medr), mae=backlog_mae(R[real], S),
                     path=rescales(S)))
print("\n| sim | real | seed | rescales | worst gap ±3 s, paired | outside the real envelope | p99 mean, median vs paired real | backlog MAE |")
print("|---|---|---|---|---|---|---|---|")
for x in rows:
    print(f"| {x['mode']}-{x['variant']} | {x['real']} | {x['seed']} | {x['n']} | {fmt_gap(x['gap'])} | {fmt_gap(x['env'])} | "
          f"{x['p99'][0]*100:+.0f} %, {x['p99'][1]*100:+.0f} % | {x['mae']:.1f} |")
print("\nSummary per mode and variant (decisions: every operator within 1 subtask; p99: mean within 30 %):")
print("| sim | runs | decisions within 1, paired | within the real envelope ±1 | p99 mean within 30 % | p99 mean error range | median error range |")
print("|---|---|---|---|---|---|---|")
for key in dict.fromkeys((x["mode"], x["variant"]) for x in rows):
    xs = [x for x in rows if (x["mode"], x["variant"]) == key]
    pair = sum(all(v <= 1 for v in x["gap"].values()) for x in xs)
    env = sum(all(v <= 1 for v in x["env"].values()) for x in xs)
    p = sum(abs(x["p99"][0]) <= 0.3 for x in xs)
    lo, hi = min(x["p99"][0] for x in xs), max(x["p99"][0] for x in xs)
    l2, h2 = min(x["p99"][1] for x in xs), max(x["p99"][1] for x in xs)
    print(f"| {key[0]}-{key[1]} | {len(xs)} | {pair}/{len(xs)} | {env}/{len(xs)} | {p}/{len(xs)} | {lo*100:+.0f} to {hi*100:+.0f} % | {l2*100:+.0f} to {h2*100:+.0f} % |")
PY
