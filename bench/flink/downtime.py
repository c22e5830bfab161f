#!/usr/bin/env python3
"""Flink side and report of scripts/bench-rescale-downtime.sh.

  downtime.py flink JAR_ID KEYS BACKEND REPEAT WORK_DIR   -> JSON lines on stdout
  downtime.py table RESULTS.jsonl                         -> Markdown table on stdout

`flink`: for each repeat, submits bench.KeyedStateJob (keyed operator at parallelism 2) to the
session cluster on 127.0.0.1:8081, waits until the keyed operator processed KEYS + 20 000
records (state filled) plus one second, then measures the rescale downtime: from the
stop-with-savepoint request (POST /jobs/<id>/stop) to the first record the keyed operator
processes in the job restored from that savepoint at parallelism 3 (stamped by the job into
WORK_DIR/first-<job id>). Savepoint status is polled every 10 ms.
"""
import json
import os
import shutil
import statistics
import sys
import time
import urllib.request

B = "http://127.0.0.1:8081"


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(B + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        text = r.read()
        return json.loads(text) if text else {}


def run_job(jar, keys, p, work, backend, savepoint=None):
    body = {"entryClass": "bench.KeyedStateJob",
            "programArgsList": [str(keys), str(p), work, "50000", backend]}
    if savepoint:
        body["savepointPath"] = savepoint
    return call("POST", f"/jars/{jar}/run", body)["jobid"]


def keyed_records_in(job):
    vs = call("GET", f"/jobs/{job}")["vertices"]
    v = next(v for v in vs if "counts" in v["name"].lower() or "process" in v["name"].lower()
             or "keyed" in v["name"].lower())
    return v["metrics"]["read-records"]


def wait_running(job):
    for _ in range(6000):
        st = call("GET", f"/jobs/{job}")
        if st["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in st["vertices"]):
            return
        if st["state"] in ("FAILED", "CANCELED"):
            sys.exit(f"flink job {job} {st['state']}")
        time.sleep(0.05)
    sys.exit(f"flink job {job} never ran")


def cancel(job):
    try:
        call("PATCH", f"/jobs/{job}?mode=cancel")
    except Exception:
        pass
    for _ in range(600):
        if call("GET", f"/jobs/{job}")["state"] in ("CANCELED", "FINISHED", "FAILED"):
            return
        time.sleep(0.05)


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def flink(jar, keys, backend, repeat, work):
    keys, repeat = int(keys), int(repeat)
    for run in range(repeat):
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        job = run_job(jar, keys, 2, work, backend)
        wait_running(job)
        t_fill = time.time()
        while True:
            n = keyed_records_in(job)
            if n >= keys + 20000:
                break
            if time.time() - t_fill > 1800:
                sys.exit("flink: state fill took over 30 min")
            time.sleep(0.2)
        fill_s = time.time() - t_fill
        time.sleep(1.0)
        t0 = time.time()
        req = call("POST", f"/jobs/{job}/stop",
                   {"targetDirectory": "file://" + os.path.join(work, "savepoints"), "drain": False})
        while True:
            st = call("GET", f"/jobs/{job}/savepoints/{req['request-id']}")
            if st["status"]["id"] == "COMPLETED":
                break
            time.sleep(0.01)
        op = st["operation"]
        if "failure-cause" in op:
            sys.exit(f"flink savepoint failed: {op['failure-cause']}")
        location = op["location"]
        t_saved = time.time() - t0
        job2 = run_job(jar, keys, 3, work, backend, location)
        t_submitted = time.time() - t0
        marker = os.path.join(work, f"first-{job2}")
        while not os.path.exists(marker) or os.path.getsize(marker) == 0:
            if time.time() - t0 > 1800:
                sys.exit("flink: no record after the restore within 30 min")
            time.sleep(0.002)
        with open(marker) as f:
            first_ms = int(f.read().strip())
        downtime = first_ms / 1000.0 - t0
        cancel(job2)
        print(json.dumps({
            "system": "flink", "backend": backend, "keys": keys, "run": run,
            "savepoint_bytes": du(location.replace("file:", "", 1)),
            "downtime_s": downtime, "stop_with_savepoint_s": t_saved,
            "submit_s": t_submitted - t_saved, "fill_s": fill_s,
        }), flush=True)
        shutil.rmtree(work, ignore_errors=True)


def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    start = next((r["seconds"] for r in rows if r.get("measure") == "process_start"), None)
    groups = {}
    for r in rows:
        if "downtime_s" not in r:
            continue
        key = (r["keys"], {"heap": "heap", "hashmap": "heap", "disk": "disk", "rocksdb": "disk"}[r["backend"]])
        groups.setdefault(key, {}).setdefault(r["system"], []).append(r)
    print("| state (keys) | backend (streamscale / Flink) | streamscale savepoint | streamscale downtime | + process start | Flink savepoint | Flink downtime | Flink / streamscale |")
    print("|---|---|---|---|---|---|---|---|")
    for (keys, kind) in sorted(groups):
        g = groups[(keys, kind)]
        ours = g.get("streamscale", [])
        theirs = g.get("flink", [])
        med = lambda rs, f: statistics.median(r[f] for r in rs) if rs else None
        o, t = med(ours, "downtime_s"), med(theirs, "downtime_s")
        ob, tb = med(ours, "savepoint_bytes"), med(theirs, "savepoint_bytes")
        fmt = lambda x, u="s": "n/a" if x is None else (f"{x:.3f} s" if u == "s" else f"{x / 1e6:.1f} MB")
        ratio = "n/a" if o is None or t is None else f"{t / o:.1f}x"
        names = "heap / hashmap" if kind == "heap" else "disk (redb) / rocksdb"
        with_start = None if o is None or start is None else o + start
        print(f"| {keys:,} | {names} | {fmt(ob, 'b')} | {fmt(o)} (n={len(ours)}) | {fmt(with_start)} | "
              f"{fmt(tb, 'b')} | {fmt(t)} (n={len(theirs)}) | {ratio} |")
    if start is not None:
        print(f"\nstreamscale-engine process start-up (exec until REST listens, median of 5): {start:.3f} s")


if __name__ == "__main__":
    if sys.argv[1] == "flink":
        flink(*sys.argv[2:7])
    elif sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
