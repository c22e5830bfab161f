#!/usr/bin/env python3
"""Samples a Flink job through REST, independently of any autoscaler, and summarises the samples.

  sample.py sample --rest URL --job JID --seconds S --out samples.csv [--every 2]
  sample.py summarise --samples samples.csv --trace FILE --trace-start T --speedup K --scale S
                      --epoch-ms E [--label L] > result.json
  sample.py table result.json ...      (markdown table with streamscale/flink ratios)

samples.csv: t (s since the job's epoch), wall (unix s), job state, per-vertex parallelism and
status, the source's pendingRecords summed over its subtasks (empty when no subtask answered).
"""
import argparse
import csv
import json
import sys
import time
import urllib.request

SOURCE_METRIC = "Source__trace.pendingRecords"


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def cmd_sample(a):
    base = a.rest.rstrip("/")
    out = open(a.out, "w", newline="")
    w = csv.writer(out)
    w.writerow(["wall", "job_state", "vertices", "parallelism", "statuses", "pending", "pending_subtasks"])
    t_end = time.time() + a.seconds
    nxt = time.time()
    while time.time() < t_end:
        now = time.time()
        try:
            d = get(f"{base}/jobs/{a.job}")
            vs = d.get("vertices", [])
            src = next((v for v in vs if v["name"].startswith("Source")), None)
            pending, answered = "", 0
            if src is not None:
                keys = ",".join(f"{i}.{SOURCE_METRIC}" for i in range(src["parallelism"]))
                try:
                    ms = get(f"{base}/jobs/{a.job}/vertices/{src['id']}/metrics?get={keys}")
                    vals = [float(m["value"]) for m in ms if m.get("value") not in (None, "", "NaN")]
                    if vals:
                        pending, answered = sum(vals), len(vals)
                except Exception:
                    pass
            w.writerow([f"{now:.3f}", d.get("state", "?"),
                        "|".join(v["name"] for v in vs),
                        "|".join(str(v["parallelism"]) for v in vs),
                        "|".join(v["status"] for v in vs),
                        pending, answered])
        except Exception as e:  # cluster busy: record a gap
            w.writerow([f"{now:.3f}", f"ERROR:{type(e).__name__}", "", "", "", "", 0])
        out.flush()
        nxt += a.every
        time.sleep(max(0.0, nxt - time.time()))
    out.close()


def load_trace(path):
    rows = []
    with open(path) as f:
        for r in csv.reader(f):
            if r and r[0][:1].isdigit():
                rows.append((float(r[0]), float(r[1])))
    return rows


def rate_at(trace, start, speedup, scale, wall_s):
    """Records per wall second due at wall second wall_s after the epoch (the job's step schedule)."""
    t = start + wall_s * speedup
    r = trace[0][1]
    for tt, rr in trace:
        if tt <= t:
            r = rr
        else:
            break
    return r * scale


def cmd_summarise(a):
    trace = load_trace(a.trace)
    rows = list(csv.DictReader(open(a.samples)))
    epoch = a.epoch_ms / 1000.0
    S = []
    for r in rows:
        if r["job_state"].startswith("ERROR") or not r["parallelism"]:
            continue
        par = [int(x) for x in r["parallelism"].split("|")]
        st = r["statuses"].split("|")
        pend = float(r["pending"]) if r["pending"] else None
        if a.until is not None and float(r["wall"]) - epoch > a.until:
            break
        S.append(dict(t=float(r["wall"]) - epoch, par=tuple(par), up=(r["job_state"] == "RUNNING" and all(s == "RUNNING" for s in st)),
                      pending=pend))
    slot_s = grow_s = over5_s = 0.0
    max_backlog = 0.0
    max_backlog_s = 0.0
    rescales = []
    downtimes = []
    down_since = None
    for i in range(1, len(S)):
        p, c = S[i - 1], S[i]
        dt = c["t"] - p["t"]
        slot_s += max(p["par"]) * dt
        rate = rate_at(trace, a.trace_start, a.speedup, a.scale, c["t"])
        if c["par"] != p["par"]:
            rescales.append(dict(t=round(c["t"], 1), frm=list(p["par"]), to=list(c["par"])))
        # downtime: from the first sample with a parallelism change or a vertex not RUNNING to the
        # first sample with every vertex RUNNING again
        if down_since is None and (not c["up"] or c["par"] != p["par"]):
            down_since = p["t"] if c["par"] != p["par"] and c["up"] else c["t"]
            down_from_par = p["par"]
        if down_since is not None and c["up"]:
            if c["par"] != down_from_par:
                downtimes.append(round(c["t"] - down_since, 1))
            down_since = None
        if c["pending"] is not None:
            max_backlog = max(max_backlog, c["pending"])
            if rate > 0:
                max_backlog_s = max(max_backlog_s, c["pending"] / rate)
            if c["pending"] > 5 * rate:
                over5_s += dt
            # growing: pendingRecords rose over the last >= 4 s (two of Flink's 2 s metric fetches)
            # faster than 1 % of the input rate
            j = i - 1
            while j > 0 and c["t"] - S[j]["t"] < 4.0 - 0.5:
                j -= 1
            q = S[j]
            if q["pending"] is not None and c["t"] > q["t"]:
                if (c["pending"] - q["pending"]) / (c["t"] - q["t"]) > 0.01 * rate:
                    grow_s += dt
    res = dict(label=a.label, samples=len(S), seconds=round(S[-1]["t"] - S[0]["t"], 1) if S else 0,
               slot_seconds=round(slot_s), rescales=len(rescales), rescale_list=rescales,
               downtimes=downtimes, lag_growing_s=round(grow_s), backlog_over_5s_s=round(over5_s),
               max_backlog=round(max_backlog), max_backlog_seconds_of_input=round(max_backlog_s, 1))
    json.dump(res, sys.stdout, indent=1)
    print()


def cmd_table(a):
    res = [json.load(open(p)) for p in a.results]
    hdr = ("| run | autoscaler | slot-seconds | rescales | parallelism path (max over vertices) | downtime per rescale (s) "
           "| backlog growing (s) | backlog > 5 s of input (s) | max backlog (records) |")
    print(hdr)
    print("|---|---|---:|---:|---|---|---:|---:|---:|")
    by = {}
    for r in res:
        mode, who = r["label"].split("/", 1)
        by.setdefault(mode, {})[who] = r
        path = " → ".join([str(max(r["rescale_list"][0]["frm"]))] + [str(max(x["to"])) for x in r["rescale_list"]]) if r["rescale_list"] else "1"
        dts = ", ".join(f"{d:g}" for d in r["downtimes"]) or "-"
        print(f"| {mode} | {who} | {r['slot_seconds']} | {r['rescales']} | {path} | {dts} | {r['lag_growing_s']} "
              f"| {r['backlog_over_5s_s']} | {r['max_backlog']} ({r['max_backlog_seconds_of_input']} s) |")
    for mode, d in by.items():
        if "streamscale" in d and "flink" in d:
            s, f = d["streamscale"], d["flink"]

            def ratio(k):
                return f"{s[k] / f[k]:.2f}" if f[k] else ("=" if s[k] == 0 else "∞")
            md = lambda r: sum(r["downtimes"]) / len(r["downtimes"]) if r["downtimes"] else 0
            mdr = f"{md(s) / md(f):.2f} (mean)" if md(f) else "-"
            print(f"| {mode} | **streamscale/flink** | {ratio('slot_seconds')} | {ratio('rescales')} | | {mdr} "
                  f"| {ratio('lag_growing_s')} | {ratio('backlog_over_5s_s')} | {ratio('max_backlog')} |")


def main():
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="cmd", required=True)
    s = sp.add_parser("sample")
    s.add_argument("--rest", required=True)
    s.add_argument("--job", required=True)
    s.add_argument("--seconds", type=float, required=True)
    s.add_argument("--every", type=float, default=2.0)
    s.add_argument("--out", required=True)
    s = sp.add_parser("summarise")
    s.add_argument("--samples", required=True)
    s.add_argument("--trace", required=True)
    s.add_argument("--trace-start", type=float, required=True)
    s.add_argument("--speedup", type=float, required=True)
    s.add_argument("--scale", type=float, required=True)
    s.add_argument("--epoch-ms", type=float, required=True)
    s.add_argument("--label", default="run")
    s.add_argument("--until", type=float, default=None,
                   help="only the samples of the first UNTIL seconds after the epoch (runs of different lengths)")
    s = sp.add_parser("table")
    s.add_argument("results", nargs="+")
    a = p.parse_args()
    {"sample": cmd_sample, "summarise": cmd_summarise, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
