#!/usr/bin/env python3
"""Measures records/s and records/s per core for Nexmark Q1, Q2, Q5 in streamscale-engine and
in a running Apache Flink session cluster (see scripts/bench-nexmark.sh, which sets it up).

Records/s per core = records processed / CPU seconds (user + system) the engine process, or
the Flink TaskManager process, spent on the run. Records/s = records / wall-clock seconds of
the run. Stdlib only.

  nexmark_bench.py engine ENGINE_BIN JOB.yaml EVENTS PARALLELISM   -> one JSON line
  nexmark_bench.py flink SQLRUNNER_JAR SQL ROWS PARALLELISM TM_PID  -> one JSON line
  nexmark_bench.py table RESULTS.jsonl                              -> Markdown table with ratios
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
FLINK = "http://127.0.0.1:8081"


def cpu_seconds(pid):
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy(interval=0.5):
    """Share of the machine's CPU time (all cores) that was busy over `interval` seconds."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v), idle
    t0, i0 = sample()
    time.sleep(interval)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def quiet(limit=0.1, timeout=20.0):
    """Waits (at most `timeout` seconds) until the machine is under `limit` busy, so that a
    run does not share the cores with the other system's finishing work (a Flink TaskManager
    keeps working for seconds after its job finished; a subtask thread that spins while it
    waits then burns CPU for nothing, and the run's records per CPU-second fall)."""
    end = time.time() + timeout
    while time.time() < end and machine_busy() > limit:
        pass


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def post(url, body=None, files=None):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def engine(binary, job, events, parallelism):
    """Runs a bounded Nexmark job at full speed; returns the measurement."""
    text = open(job).read()
    text = re.sub(r"rate: \{ constant: [0-9.e]+ \}", "rate: { constant: 1.0e9 }", text)
    text = text.replace("kind: source\n", f"kind: source\n    count: {events}\n", 1)
    name = re.search(r"^name: (\S+)", text, re.M).group(1)
    ops = re.findall(r"name: ([A-Za-z0-9_-]+), kind:|- name: ([A-Za-z0-9_-]+)\n", text)
    ops = [a or b for a, b in ops]
    quiet()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job.yaml")
        open(path, "w").write(text)
        # Every operator, the sink too, at `parallelism`: Flink's `parallelism.default` also
        # applies to its sink, so both systems run the same shape.
        over = ",".join(f"{o}={parallelism}" for o in ops)
        proc = subprocess.Popen([binary, "--job", path, "--savepoint-dir", d, "--parallelism", over],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            base = "http://" + json.loads(line)["address"]
            t0 = time.time()
            while True:
                job_view = get(base + "/v1/job")
                if job_view["state"] in ("finished", "failed"):
                    break
                time.sleep(0.05)
            wall = time.time() - t0
            cpu = cpu_seconds(proc.pid)
            if job_view["state"] != "finished":
                raise SystemExit(f"engine job failed: {job_view}")
        finally:
            proc.kill()
            proc.wait()
    return {"system": "streamscale", "query": name.split("-")[-1], "parallelism": parallelism,
            "records": events, "wall_s": wall, "cpu_s": cpu}


def flink(jar_id, sql, rows, parallelism, tm_pid):
    """Submits a bounded Flink SQL job, waits for it to finish; returns the measurement."""
    text = open(sql).read().replace("@ROWS@", str(rows)).replace("@PARALLELISM@", str(parallelism))
    query = re.search(r"nexmark-(q\d+)", text).group(1)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(text)
        path = f.name
    quiet()
    cpu0 = cpu_seconds(tm_pid)
    t_submit = time.time()
    job = post(f"{FLINK}/jars/{jar_id}/run", {"entryClass": "demo.SqlRunner",
                                             "programArgsList": [path]})["jobid"]
    t0 = None
    while True:
        d = get(f"{FLINK}/jobs/{job}")
        if t0 is None and d["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in d["vertices"]):
            t0 = time.time()
        if d["state"] in ("FINISHED", "FAILED", "CANCELED"):
            break
        time.sleep(0.1)
    t1 = time.time()
    cpu = cpu_seconds(tm_pid) - cpu0
    os.unlink(path)
    if d["state"] != "FINISHED":
        raise SystemExit(f"flink job {job} {d['state']}")
    wall = t1 - (t0 or t_submit)
    return {"system": "flink", "query": query, "parallelism": parallelism, "records": rows,
            "wall_s": wall, "cpu_s": cpu}


def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    by = {(r["system"], r["query"], r["parallelism"]): r for r in rows}
    out = ["| query | p | streamscale rec/s | streamscale rec/s/core | Flink rec/s | Flink rec/s/core | ratio per core | ratio rec/s |",
           "|---|---|---|---|---|---|---|---|"]
    for q in ("q1", "q2", "q5"):
        for p in (1, 2):
            s, f = by.get(("streamscale", q, p)), by.get(("flink", q, p))
            if not s or not f:
                continue
            sr, sc = s["records"] / s["wall_s"], s["records"] / s["cpu_s"]
            fr, fc = f["records"] / f["wall_s"], f["records"] / f["cpu_s"]
            out.append(f"| {q.upper()} | {p} | {sr:,.0f} | {sc:,.0f} | {fr:,.0f} | {fc:,.0f} | "
                       f"{sc / fc:.2f}x | {sr / fr:.2f}x |")
    print("\n".join(out))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "engine":
        print(json.dumps(engine(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    elif cmd == "flink":
        print(json.dumps(flink(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                               int(sys.argv[6]))))
    elif cmd == "table":
        table(sys.argv[2])
    else:
        raise SystemExit(__doc__)
