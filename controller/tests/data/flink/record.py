#!/usr/bin/env python3
"""Re-records the Flink REST JSON in this folder from a real Flink 2.3.0 cluster.

    controller/tests/data/flink/record.py          (about 6 minutes; starts and stops the cluster)

Uses scripts/flink-testenv.sh (install, start, stop) and the demo job flink-jobs/trace-job with its
default arguments (4000 records/s, 300 us per record, 1000 keys). Writes the *.json files and
timings.json next to this script; README.md describes them. Stdlib only.
"""
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../../../.."))
TESTENV = os.path.join(ROOT, "scripts/flink-testenv.sh")
ENTRY = "streamscale.tracejob.TraceJob"
TIMES = {}


def sh(*args, env=None):
    return subprocess.run([TESTENV, *args], check=True, capture_output=True, text=True, env=env).stdout


def call(method, path, body=None, form_file=None):
    """(status, parsed JSON body) of a REST call."""
    url = B + path
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if form_file is not None:
        boundary = "streamscale%016x" % random.getrandbits(64)
        with open(form_file, "rb") as f:
            content = f.read()
        data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"jarfile\"; "
                f"filename=\"{os.path.basename(form_file)}\"\r\nContent-Type: application/java-archive\r\n\r\n"
                ).encode() + content + f"\r\n--{boundary}--\r\n".encode()
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def get(path):
    status, body = call("GET", path)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body}")
    return body


def save(name, obj):
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    print(f"  wrote {name}", flush=True)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait(pred, timeout, step=0.1, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise RuntimeError(f"timeout waiting for {what}")


def vertices(jid):
    return get(f"/jobs/{jid}")["vertices"]


def all_running(jid, want=None):
    d = get(f"/jobs/{jid}")
    ok = d["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in d["vertices"])
    if want is not None:
        ok = ok and [v["parallelism"] for v in d["vertices"]] == want
    return ok


def keyed_reads(jid, kv):
    """Per-subtask read-records of the keyed vertex (REST view, refreshed by the metric fetcher)."""
    return [s["metrics"].get("read-records", 0) for s in get(f"/jobs/{jid}/vertices/{kv}")["subtasks"]]


def flowing(jid, kv):
    """True once every keyed subtask (of the current attempt) has read records."""
    return all(x > 0 for x in keyed_reads(jid, kv))


def prime(jid, *vids):
    """The metric fetcher is lazy: the first request after a pause answers from the old store and
    starts a fetch. Ask once, wait for the fetch, so that the next answers are fresh."""
    for v in vids:
        get(f"/jobs/{jid}/vertices/{v}")
    time.sleep(1.5)


def agg(jid, vid, ids, aggs="min,max,sum"):
    return get(f"/jobs/{jid}/vertices/{vid}/subtasks/metrics?get={','.join(ids)}&agg={aggs}")


def main():
    global B
    # Fresher REST views than Flink's defaults (metrics fetched at most every 10 s, job details
    # cached for 3 s), so that the timings and the states during a rescale can be seen.
    env = dict(os.environ, FLINK_EXTRA_CONFIG=os.environ.get(
        "FLINK_EXTRA_CONFIG", "metrics.fetcher.update-interval: 1s\nrest.cache.execution-graph.timeout: 0s"))
    sh("install")
    sh("stop")
    t0 = time.time()
    out = sh("start", env=env)
    TIMES["cluster_start_s"] = round(time.time() - t0, 1)
    conf = dict(line.split("=", 1) for line in sh("env").split())
    B = conf["FLINK_REST_URL"]
    sp_dir = "file://" + conf["FLINK_SAVEPOINT_DIR"]
    log(f"cluster up in {TIMES['cluster_start_s']} s: {out.strip()}")

    # ---------------------------------------------------------------- first submission, p=1
    t0 = time.time()
    status, up = call("POST", "/jars/upload", form_file=conf["FLINK_DEMO_JAR"])
    save("jars-upload.json", up)
    jar_id = up["filename"].rsplit("/", 1)[-1]
    status, run = call("POST", f"/jars/{jar_id}/run", {"entryClass": ENTRY, "programArgsList": []})
    assert status == 200, run
    save("jars-run.json", run)
    jid = run["jobid"]
    wait(lambda: all_running(jid), 120, what="first job RUNNING")
    TIMES["submit_to_running_s"] = round(time.time() - t0, 1)
    vs = vertices(jid)
    sv = next(v["id"] for v in vs if v["name"].startswith("Source"))
    kv = next(v["id"] for v in vs if not v["name"].startswith("Source"))
    wait(lambda: flowing(jid, kv), 120, step=0.2, what="records")
    TIMES["submit_to_records_flowing_s"] = round(time.time() - t0, 1)
    epoch = get(f"/jobs/{jid}/config")["execution-config"]["user-config"]["epoch-ms"]
    log(f"job {jid} RUNNING in {TIMES['submit_to_running_s']} s, records after {TIMES['submit_to_records_flowing_s']} s")

    log("p=1 overloaded: waiting 70 s for the 60 s moving averages")
    time.sleep(70)
    wait(lambda: get(f"/jobs/{jid}/vertices/{sv}/subtasks/0/metrics?get=Source__trace.pendingRecords"), 120,
         step=1, what="source metrics")
    prime(jid, sv, kv)
    save("overview.json", get("/overview"))
    save("jobs-overview.json", get("/jobs/overview"))
    save("job.json", get(f"/jobs/{jid}"))
    save("job-config.json", get(f"/jobs/{jid}/config"))
    save("vertex-source.json", get(f"/jobs/{jid}/vertices/{sv}"))
    save("vertex-keyed.json", get(f"/jobs/{jid}/vertices/{kv}"))
    save("source-subtask0-metric-ids.json", get(f"/jobs/{jid}/vertices/{sv}/subtasks/0/metrics"))
    save("keyed-subtask0-metric-ids.json", get(f"/jobs/{jid}/vertices/{kv}/subtasks/0/metrics"))
    src_ids = ["Source__trace.pendingRecords", "Source__trace.numRecordsOut", "Source__trace.numRecordsOutPerSecond",
               "busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond"]
    save("source-subtask0-metric-values.json",
         get(f"/jobs/{jid}/vertices/{sv}/subtasks/0/metrics?get={','.join(src_ids)}"))
    save("source-vertex-metric-values.json",
         get(f"/jobs/{jid}/vertices/{sv}/metrics?get={','.join('0.' + i for i in src_ids[:2])}"))
    save("source-subtasks-metrics-agg.json", agg(jid, sv, src_ids))
    keyed_ids = ["count.maxKeyCount", "numRecordsIn", "busyTimeMsPerSecond", "backPressuredTimeMsPerSecond",
                 "idleTimeMsPerSecond", "numRecordsInPerSecond"]
    save("keyed-subtasks-metrics-agg.json", agg(jid, kv, keyed_ids))
    save("resource-requirements.json", get(f"/jobs/{jid}/resource-requirements"))
    time.sleep(8.5)
    prime(jid, sv, kv)
    save("vertex-source-later.json", get(f"/jobs/{jid}/vertices/{sv}"))
    save("vertex-keyed-later.json", get(f"/jobs/{jid}/vertices/{kv}"))
    save("source-subtask0-metric-values-later.json",
         get(f"/jobs/{jid}/vertices/{sv}/subtasks/0/metrics?get={','.join(src_ids)}"))

    # ---------------------------------------------------------------- in-place rescale keyed 1 -> 3
    body = {sv: {"parallelism": {"lowerBound": 1, "upperBound": 1}},
            kv: {"parallelism": {"lowerBound": 1, "upperBound": 3}}}
    t0 = time.time()
    status, put = call("PUT", f"/jobs/{jid}/resource-requirements", body)
    save("resource-requirements-put.json", {"request": body, "status": status, "response": put})
    seen, caught = [], None
    while time.time() - t0 < 120:
        d = get(f"/jobs/{jid}")
        shape = (d["state"], tuple((v["parallelism"], v["status"]) for v in d["vertices"]))
        if not seen or seen[-1][1] != shape:
            seen.append((round(time.time() - t0, 2), shape))
            if caught is None and (d["state"] != "RUNNING" or any(v["status"] != "RUNNING" for v in d["vertices"])):
                caught = d
        if shape == ("RUNNING", ((1, "RUNNING"), (3, "RUNNING"))):
            break
        time.sleep(0.05)
    TIMES["inplace_rescale_to_running_s"] = round(time.time() - t0, 1)
    if caught is not None:
        save("job-rescaling.json", caught)
    wait(lambda: flowing(jid, kv), 120, step=0.2, what="records after rescale")
    TIMES["inplace_rescale_to_records_flowing_s"] = round(time.time() - t0, 1)
    TIMES["inplace_rescale_states"] = [[t, s[0], [list(x) for x in s[1]]] for t, s in seen]
    save("resource-requirements-after.json", get(f"/jobs/{jid}/resource-requirements"))
    partial = {kv: {"parallelism": {"lowerBound": 1, "upperBound": 2}}}
    status, resp = call("PUT", f"/jobs/{jid}/resource-requirements", partial)
    save("resource-requirements-put-incomplete.json", {"request": partial, "status": status, "response": resp})
    log(f"in-place rescale: RUNNING at 1,3 in {TIMES['inplace_rescale_to_running_s']} s, "
        f"records in {TIMES['inplace_rescale_to_records_flowing_s']} s; states {seen}")
    time.sleep(30)
    prime(jid, sv, kv)
    save("vertex-keyed-p3.json", get(f"/jobs/{jid}/vertices/{kv}"))
    save("job-p3.json", get(f"/jobs/{jid}"))

    # ---------------------------------------------------------------- savepoint that fails
    bad = os.path.join(os.path.dirname(conf["FLINK_SAVEPOINT_DIR"]), "not-a-dir")
    with open(bad, "w") as f:
        f.write("a file, so that no savepoint directory can be created below it\n")
    status, trig = call("POST", f"/jobs/{jid}/savepoints", {"target-directory": f"file://{bad}/sp", "cancel-job": False})
    save("savepoint-failed-trigger.json", {"status": status, "body": trig})
    rid = trig["request-id"]
    res = wait(lambda: (lambda r: r if r["status"]["id"] == "COMPLETED" else None)(
        get(f"/jobs/{jid}/savepoints/{rid}")), 60, what="failed savepoint status")
    save("savepoint-failed.json", res)
    os.remove(bad)

    # ---------------------------------------------------------------- stop with savepoint
    time.sleep(6)
    prime(jid, kv)
    max_before = {m["id"]: m for m in agg(jid, kv, ["count.maxKeyCount"], "max")}["count.maxKeyCount"]["max"]
    t0 = time.time()
    status, trig = call("POST", f"/jobs/{jid}/stop", {"targetDirectory": sp_dir, "drain": False})
    save("savepoint-trigger.json", {"status": status, "body": trig})
    rid = trig["request-id"]
    in_progress = None
    while True:
        r = get(f"/jobs/{jid}/savepoints/{rid}")
        if r["status"]["id"] == "COMPLETED":
            break
        in_progress = in_progress or r
        time.sleep(0.05)
    TIMES["stop_with_savepoint_s"] = round(time.time() - t0, 1)
    if in_progress:
        save("savepoint-in-progress.json", in_progress)
    save("savepoint-completed.json", r)
    sp = r["operation"]["location"]
    wait(lambda: get(f"/jobs/{jid}")["state"] == "FINISHED", 60, what="FINISHED after stop")
    save("job-finished.json", get(f"/jobs/{jid}"))
    log(f"stop-with-savepoint {TIMES['stop_with_savepoint_s']} s -> {sp}")

    # ---------------------------------------------------------------- resubmit with overrides (REST)
    run_body = {"entryClass": ENTRY, "programArgsList": ["--epoch-ms", epoch], "savepointPath": sp,
                "flinkConfiguration": {"pipeline.jobvertex-parallelism-overrides": f"{sv}:1,{kv}:2"}}
    t0 = time.time()
    status, run2 = call("POST", f"/jars/{jar_id}/run", run_body)
    save("jars-run-restore.json", {"request": run_body, "status": status, "response": run2})
    jid2 = run2["jobid"]
    wait(lambda: all_running(jid2, [1, 2]), 120, what="restored job RUNNING at 1,2")
    TIMES["resubmit_to_running_s"] = round(time.time() - t0, 1)
    wait(lambda: flowing(jid2, kv), 120, step=0.2, what="records after restore")
    TIMES["resubmit_to_records_flowing_s"] = round(time.time() - t0, 1)
    save("checkpoints-restored.json", get(f"/jobs/{jid2}/checkpoints"))
    prime(jid2, kv)
    after = agg(jid2, kv, ["count.maxKeyCount", "numRecordsIn"], "max,sum")
    save("keyed-subtasks-metrics-agg-after-restore.json", after)
    after = {m["id"]: m for m in after}
    max_after = after["count.maxKeyCount"]["max"]
    TIMES["max_key_count_before_stop"] = max_before
    TIMES["max_key_count_after_restore"] = max_after
    TIMES["keyed_records_in_since_restore"] = after["numRecordsIn"]["sum"]
    log(f"restored {jid2} at 1,2: RUNNING {TIMES['resubmit_to_running_s']} s, records "
        f"{TIMES['resubmit_to_records_flowing_s']} s; maxKeyCount {max_before} -> {max_after}")

    # ---------------------------------------------------------------- errors, restart
    missing = "%032x" % random.getrandbits(128)
    status, body = call("GET", f"/jobs/{missing}")
    save("job-not-found.json", {"request": f"GET /jobs/{missing}", "status": status, "body": body})
    status, body = call("GET", f"/jobs/{missing}/vertices/{kv}")
    save("vertex-job-not-found.json", {"request": f"GET /jobs/{missing}/vertices/{kv}", "status": status, "body": body})
    status, body = call("GET", f"/jobs/{jid2}/vertices/{missing}")
    save("vertex-not-found.json", {"request": f"GET /jobs/{jid2}/vertices/{missing}", "status": status, "body": body})

    # A TaskManager dies: the job restarts (adaptive scheduler: waits for resources, then restores).
    run_dir = os.path.dirname(conf["FLINK_SAVEPOINT_DIR"])
    pid_file = next(os.path.join(run_dir, "pid", f) for f in os.listdir(os.path.join(run_dir, "pid")) if "taskexecutor" in f)
    pids = open(pid_file).read().split()
    time.sleep(5)
    t0 = time.time()
    for p in pids:
        os.kill(int(p), 9)
    tm_env = dict(env, FLINK_CONF_DIR=os.path.join(run_dir, "conf"), FLINK_LOG_DIR=os.path.join(run_dir, "log"),
                  FLINK_PID_DIR=os.path.join(run_dir, "pid"))
    with open(pid_file, "w") as f:
        f.write("")
    subprocess.run([os.path.join(conf["FLINK_HOME"], "bin/taskmanager.sh"), "start"], env=tm_env, check=True,
                   capture_output=True)
    seen, saved = [], set()
    while time.time() - t0 < 240:
        d = get(f"/jobs/{jid2}")
        shape = (d["state"], tuple((v["parallelism"], v["status"]) for v in d["vertices"]))
        if not seen or seen[-1][1] != shape:
            seen.append((round(time.time() - t0, 2), shape))
            if d["state"] not in saved and d["state"] != "RUNNING":
                saved.add(d["state"])
                save(f"job-{d['state'].lower()}.json", d)
        if len(seen) > 1 and shape[0] == "RUNNING" and all(x[1] == "RUNNING" for x in shape[1]):
            break
        time.sleep(0.1)
    TIMES["tm_kill_to_running_s"] = round(time.time() - t0, 1)
    TIMES["tm_kill_states"] = [[t, s[0], [list(x) for x in s[1]]] for t, s in seen]
    save("job-exceptions.json", get(f"/jobs/{jid2}/exceptions"))
    log(f"TaskManager killed and restarted: RUNNING again after {TIMES['tm_kill_to_running_s']} s; states {seen}")

    call("PATCH", f"/jobs/{jid2}?mode=cancel")
    sh("stop")

    # ---------------------------------------------------------------- default scheduler
    sh("start", "--scheduler", "default", env=env)
    status, run3 = call("POST", f"/jars/{call('POST', '/jars/upload', form_file=conf['FLINK_DEMO_JAR'])[1]['filename'].rsplit('/', 1)[-1]}/run",
                        {"entryClass": ENTRY, "programArgsList": []})
    jid3 = run3["jobid"]
    wait(lambda: all_running(jid3), 120, what="job on the default scheduler")
    status, body = call("GET", f"/jobs/{jid3}/resource-requirements")
    save("resource-requirements-default-scheduler.json",
         {"request": f"GET /jobs/{jid3}/resource-requirements (jobmanager.scheduler: default)", "status": status, "body": body})
    save("jobs-overview-default-scheduler.json", get("/jobs/overview"))
    call("PATCH", f"/jobs/{jid3}?mode=cancel")
    save("timings.json", TIMES)
    sh("stop")
    log("cluster stopped")


if __name__ == "__main__":
    B = None
    try:
        main()
    except BaseException:
        subprocess.run([TESTENV, "stop"], capture_output=True)
        raise
