#!/usr/bin/env python3
"""Overload benchmark: runs a Nexmark query at a multiple of its sustainable input rate for a
fixed time and samples the process's resident memory (VmRSS) once a second, in
streamscale-engine and in a running Apache Flink session cluster (see scripts/bench-overload.sh).

The sustainable rate is measured first by the same system on the same query (a bounded run at
full speed: records / wall seconds). Under overload the input cannot be absorbed, so memory
stays bounded only if the engine pushes back on its sources instead of queueing without limit.
Stdlib only.

  overload_bench.py engine ENGINE_BIN JOB.yaml RATE PARALLELISM SECONDS        -> one JSON line
  overload_bench.py flink SQLRUNNER_JAR SQL RATE PARALLELISM SECONDS TM_PID    -> one JSON line
  overload_bench.py table RESULTS.jsonl                                       -> Markdown table
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

FLINK = "http://127.0.0.1:8081"


def rss_mib(pid):
    """Resident set size of a process, MiB (VmRSS from /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for pid {pid}")


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def text(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def metric_sum(body, name):
    """Sum of every sample of metric family `name` in a Prometheus text body."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine(binary, job, rate, parallelism, seconds):
    """Runs `job` with a constant source rate of `rate` records/s for `seconds`; samples RSS,
    the sources' backlog (records due but not emitted) and the records in input queues."""
    src = open(job).read()
    src = re.sub(r"rate: \{ constant: [0-9.e]+ \}", f"rate: {{ constant: {rate:.1f} }}", src)
    ops = re.findall(r"name: ([A-Za-z0-9_-]+), kind:|- name: ([A-Za-z0-9_-]+)\n", src)
    ops = [a or b for a, b in ops]
    name = re.search(r"^name: (\S+)", src, re.M).group(1)
    samples = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job.yaml")
        open(path, "w").write(src)
        over = ",".join(f"{o}={parallelism}" for o in ops)
        proc = subprocess.Popen([binary, "--job", path, "--savepoint-dir", d, "--parallelism", over],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            base = "http://" + json.loads(proc.stdout.readline())["address"]
            t0 = time.time()
            while time.time() - t0 < seconds:
                time.sleep(1.0 - ((time.time() - t0) % 1.0))
                m = text(base + "/metrics")
                samples.append({
                    "t": round(time.time() - t0, 1),
                    "rss_mib": round(rss_mib(proc.pid), 1),
                    "backlog": metric_sum(m, "streamscale_source_backlog_records"),
                    "queued": metric_sum(m, "streamscale_input_queue_length"),
                    "sink_in": metric_sum(m, "streamscale_records_in_total{operator=\"sink\""),
                })
            state = get(base + "/v1/job")["state"]
            if state == "failed":
                raise SystemExit("engine job failed under overload")
        finally:
            proc.kill()
            proc.wait()
    return {"system": "streamscale", "query": name.split("-")[-1], "parallelism": parallelism,
            "rate": rate, "seconds": seconds, "samples": samples}


def flink(jar_id, sql, rate, parallelism, seconds, tm_pid):
    """Submits the Flink SQL job with `datagen` at `rate` rows/s, samples the TaskManager's RSS
    for `seconds`, then cancels the job."""
    body = (open(sql).read()
            .replace("'number-of-rows' = '@ROWS@',", "")
            .replace("'rows-per-second' = '1000000000'", f"'rows-per-second' = '{int(rate)}'")
            .replace("@PARALLELISM@", str(parallelism)))
    query = re.search(r"nexmark-(q\d+)", body).group(1)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(body)
        path = f.name
    req = urllib.request.Request(f"{FLINK}/jars/{jar_id}/run", method="POST",
                                 data=json.dumps({"entryClass": "demo.SqlRunner",
                                                  "programArgsList": [path]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        job = json.load(r)["jobid"]
    while True:
        d = get(f"{FLINK}/jobs/{job}")
        if d["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in d["vertices"]):
            break
        if d["state"] in ("FAILED", "CANCELED", "FINISHED"):
            raise SystemExit(f"flink job {job} {d['state']}")
        time.sleep(0.1)
    samples = []
    t0 = time.time()
    try:
        while time.time() - t0 < seconds:
            time.sleep(1.0 - ((time.time() - t0) % 1.0))
            samples.append({"t": round(time.time() - t0, 1), "rss_mib": round(rss_mib(tm_pid), 1)})
        if get(f"{FLINK}/jobs/{job}")["state"] != "RUNNING":
            raise SystemExit(f"flink job {job} stopped under overload")
    finally:
        urllib.request.urlopen(urllib.request.Request(f"{FLINK}/jobs/{job}?mode=cancel",
                                                      method="PATCH"), timeout=10).read()
        os.unlink(path)
    return {"system": "flink", "query": query, "parallelism": parallelism, "rate": rate,
            "seconds": seconds, "samples": samples}


def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    out = ["| system | query | p | input rate (rec/s) | RSS at 5 s | RSS at 30 s | RSS at 60 s | peak RSS | source backlog at end |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["samples"]

        def at(t):
            return min(s, key=lambda x: abs(x["t"] - t))["rss_mib"]
        peak = max(x["rss_mib"] for x in s)
        backlog = f"{s[-1]['backlog']:,.0f}" if "backlog" in s[-1] else "n/a"
        out.append(f"| {r['system']} | {r['query'].upper()} | {r['parallelism']} | {r['rate']:,.0f} | "
                   f"{at(5):.0f} MiB | {at(30):.0f} MiB | {at(r['seconds']):.0f} MiB | {peak:.0f} MiB | {backlog} |")
    print("\n".join(out))
    for r in rows:
        series = " ".join(f"{x['rss_mib']:.0f}" for x in r["samples"][::5])
        print(f"\n{r['system']} RSS every 5 s (MiB): {series}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "engine":
        print(json.dumps(engine(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]),
                                float(sys.argv[6]))))
    elif cmd == "flink":
        print(json.dumps(flink(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]),
                               float(sys.argv[6]), int(sys.argv[7]))))
    elif cmd == "table":
        table(sys.argv[2])
    else:
        raise SystemExit(__doc__)
