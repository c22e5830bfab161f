#!/usr/bin/env python3
"""Measured runs of bench/kafka-flink (driven by run.sh; see README.md there).

Kafka -> keyed 1 s window count/sum -> Kafka (exactly-once) on the streamscale engine and on a
Flink 2.3 session cluster, reading one pre-filled topic. The results are read back by a
read_committed consumer (confluent-kafka), which also decides when a run is done: when the
committed window counts add up to every input record. CPU seconds come from /proc/PID/stat
(utime + stime of the engine process; of the JobManager and TaskManager for Flink).

Subcommands (all print one JSON object per result on stdout):
  topic BROKERS NAME PARTITIONS          create a topic (no error when it exists)
  size BROKERS TOPIC                     records in a topic (sum of end offsets)
  throughput --side engine|flink ...     one run: records/s, CPU s, per-key totals verified
  latency --side engine ...              a constant-rate run: p50/p99 production -> committed
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

M64 = (1 << 64) - 1
CLK_TCK = os.sysconf("SC_CLK_TCK")


def fmix64(k):
    """murmur3's 64-bit finalizer (engine/src/keygroup.rs murmur_fmix64)."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def key_hash(b):
    """The engine's record key of key bytes b (engine/src/kafka/mod.rs key_hash)."""
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & M64
    return fmix64(h)


def norm_key(k):
    """A result's key as the engine writes it: Flink's string keys mapped to the engine's hash."""
    return str(key_hash(k.encode())) if isinstance(k, str) else str(k)


def expected_totals(n, keys):
    """Per-key (count, sum) of records 0..n-1 of `streamscale load` (controller/src/load.rs)."""
    t = {}
    for seq in range(n):
        k = norm_key("k%d" % (fmix64(seq ^ 0x10AD) % keys))
        c = t.setdefault(k, [0, 0])
        c[0] += 1
        c[1] += seq % 100
    return t


def cpu_seconds(pids):
    total = 0
    for p in pids:
        with open("/proc/%d/stat" % p) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def end_offsets(brokers, topic):
    c = Consumer({"bootstrap.servers": brokers, "group.id": "bench-size", "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10)
    n = 0
    for p in md.topics[topic].partitions:
        for attempt in range(50):
            try:
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                break
            except KafkaException:
                # A topic just created may have no leader yet.
                if attempt == 49:
                    raise
                time.sleep(0.2)
        n += hi - lo
    c.close()
    return n


class CommittedWatcher:
    """A read_committed reader of a result topic, from its beginning."""

    def __init__(self, brokers, topic):
        self.c = Consumer({
            "bootstrap.servers": brokers,
            "group.id": "bench-watch-%s-%d" % (topic, os.getpid()),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        })
        md = self.c.list_topics(topic, timeout=10)
        self.c.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
        self.totals = {}
        self.count = 0
        self.arrivals = []  # (time, key, count) in arrival order

    def poll(self, timeout=0.05):
        for m in self.c.consume(num_messages=10000, timeout=timeout):
            if m.error():
                continue
            now = time.time()
            v = json.loads(m.value())
            k = norm_key(v["key"])
            t = self.totals.setdefault(k, [0, 0])
            t[0] += v["count"]
            t[1] += v["sum"]
            self.count += v["count"]
            self.arrivals.append((now, k, v["count"]))

    def close(self):
        self.c.close()


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"{}")


def engine_job_yaml(a, output, checkpoint_s, workdir):
    p = a.parallelism
    return f"""name: bench-kafka-sum
maxParallelism: 128
operators:
  - name: source
    kind: source
    parallelism: {p}
    kafka: {{ topic: {a.input}, bootstrapServers: "{a.brokers}", keyBy: key, valueField: value }}
  - name: sum
    kind: window
    parallelism: {p}
    sizeMs: 1000
  - name: sink
    kind: sink
    parallelism: {p}
    kafka: {{ topic: {output}, bootstrapServers: "{a.brokers}", transactionalIdPrefix: {output} }}
edges:
  - {{ from: source, to: sum }}
  - {{ from: sum, to: sink }}
checkpoint: {{ intervalSeconds: {checkpoint_s}, dir: {workdir}/checkpoints }}
"""


class EngineRun:
    def __init__(self, a, output, checkpoint_s):
        self.workdir = os.path.join(a.workdir, output)
        os.makedirs(self.workdir, exist_ok=True)
        job = os.path.join(self.workdir, "job.yaml")
        with open(job, "w") as f:
            f.write(engine_job_yaml(a, output, checkpoint_s, self.workdir))
        self.log = open(os.path.join(self.workdir, "engine.log"), "w")
        self.proc = subprocess.Popen(
            [a.engine_bin, "--job", job, "--savepoint-dir", os.path.join(self.workdir, "savepoints")],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self.pids = [self.proc.pid]

    def alive(self):
        return self.proc.poll() is None

    def source_records(self):
        """Records the source subtasks have emitted (the engine's /metrics), None before it serves."""
        try:
            with open(os.path.join(self.workdir, "engine.log")) as f:
                addr = next(json.loads(l)["address"] for l in f if l.startswith('{"address"'))
            with urllib.request.urlopen("http://%s/metrics" % addr, timeout=5) as r:
                text = r.read().decode()
        except (StopIteration, OSError, ValueError):
            return None
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith('streamscale_records_out_total{operator="source"'))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def flink_pids(a):
    return [int(open(f).read().split()[0]) for f in a.flink_pid_files]


class FlinkRun:
    def __init__(self, a, output, checkpoint_ms):
        self.rest = a.flink_rest
        self.pids = flink_pids(a)
        args = ["--brokers", a.brokers, "--input", a.input, "--output", output,
                "--parallelism", str(a.parallelism), "--checkpoint-ms", str(checkpoint_ms),
                "--transactional-id-prefix", output, "--group", output]
        r = http("POST", "%s/jars/%s/run" % (self.rest, a.flink_jar_id),
                 {"entryClass": "streamscale.bench.KafkaWindowSum", "programArgsList": args})
        self.job = r["jobid"]

    def alive(self):
        st = http("GET", "%s/jobs/%s" % (self.rest, self.job))["state"]
        return st not in ("FAILED", "CANCELED", "FINISHED")

    def stop(self):
        try:
            http("PATCH", "%s/jobs/%s?mode=cancel" % (self.rest, self.job))
        except Exception:
            pass
        for _ in range(100):
            if not self.alive():
                return
            time.sleep(0.2)


def start(a, output, checkpoint_ms):
    if a.side == "engine":
        return EngineRun(a, output, checkpoint_ms / 1000)
    return FlinkRun(a, output, checkpoint_ms)


def create_topic(brokers, name, partitions):
    admin = AdminClient({"bootstrap.servers": brokers})
    fs = admin.create_topics([NewTopic(name, partitions, 1)])
    for f in fs.values():
        try:
            f.result()
        except Exception as e:  # already exists
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    # A reader assigned before every partition has a leader may see nothing: wait for them.
    for _ in range(100):
        md = admin.list_topics(name, timeout=10).topics[name]
        if md.error is None and md.partitions and all(p.leader >= 0 for p in md.partitions.values()):
            break
        time.sleep(0.1)
    end_offsets(brokers, name)


def cmd_throughput(a):
    n = end_offsets(a.brokers, a.input)
    output = a.output
    create_topic(a.brokers, output, a.out_partitions)
    w = CommittedWatcher(a.brokers, output)
    w.poll(0.5)
    load0 = open("/proc/loadavg").read().split()[0]
    t0 = time.time()
    # Flink's cluster is up before the run (its CPU counted from the submission on); the
    # engine's process starts with the run.
    cpu0 = cpu_seconds(flink_pids(a)) if a.side == "flink" else 0.0
    run = start(a, output, a.checkpoint_ms)
    deadline = t0 + a.timeout
    last_alive_check = t0
    while w.count < n and time.time() < deadline:
        if a.done == "consumed":
            # The source has emitted every input record (for checkpoint intervals longer than
            # the run, whose results are committed only at the next checkpoint).
            time.sleep(0.05)
            if (run.source_records() or 0) >= n:
                break
            continue
        w.poll()
        if time.time() - last_alive_check > 2:
            last_alive_check = time.time()
            if not run.alive():
                break
    t1 = time.time()
    cpu1 = cpu_seconds(run.pids)
    load1 = open("/proc/loadavg").read().split()[0]
    run.stop()
    # Anything committed after the last input record was counted would be a duplicate.
    end = time.time() + 2
    while time.time() < end:
        w.poll()
    w.close()
    done = w.count == n or a.done == "consumed"
    expected = None
    if a.verify:
        cached = os.path.join(a.workdir, "expected-%d-%d.json" % (n, a.keys))
        if os.path.exists(cached):
            expected = json.load(open(cached))
        else:
            expected = expected_totals(n, a.keys)
            json.dump(expected, open(cached, "w"))
    ok = done and (expected is None or a.done == "consumed" or w.totals == expected)
    res = {
        "side": a.side, "parallelism": a.parallelism, "checkpoint_ms": a.checkpoint_ms,
        "records": n, "committed": w.count, "seconds": round(t1 - t0, 2),
        "records_per_s": round(n / (t1 - t0)), "cpu_s": round(cpu1 - cpu0, 2),
        "records_per_cpu_s": round(n / max(cpu1 - cpu0, 1e-9)),
        "load_before": load0, "load_after": load1,
        "verified": None if a.done == "consumed" else ok, "done": a.done,
        "output": output,
    }
    with open(os.path.join(a.workdir, output + ".totals.json"), "w") as f:
        json.dump(w.totals, f)
    print(json.dumps(res), flush=True)
    if not ok:
        print("error: %s p=%d: committed %d of %d records%s" % (
            a.side, a.parallelism, w.count, n,
            "" if expected is None or w.totals == expected else "; per-key totals differ from the input's"),
            file=sys.stderr)
        return 1
    return 0


def input_times(brokers, topic):
    """Per key: production times (Kafka CreateTime, s) of its records in offset order."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "bench-in-%d" % os.getpid(),
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10)
    parts = list(md.topics[topic].partitions)
    his = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    times, pos = {}, {p: 0 for p in parts}
    while any(pos[p] < his[p] for p in parts):
        for m in c.consume(num_messages=10000, timeout=1):
            if m.error():
                continue
            pos[m.partition()] = m.offset() + 1
            times.setdefault(norm_key(m.key().decode()), []).append(m.timestamp()[1] / 1000)
    c.close()
    return times


def cmd_latency(a):
    """Constant-rate load into a fresh topic while the job runs; latency of every record from
    its production (Kafka CreateTime) to the arrival, at a read_committed reader, of the window
    result that counts it (a key's records are counted in order: one partition, one subtask)."""
    create_topic(a.brokers, a.input, a.in_partitions)
    create_topic(a.brokers, a.output, a.out_partitions)
    w = CommittedWatcher(a.brokers, a.output)
    trace = os.path.join(a.workdir, "constant-%d.csv" % a.rate)
    with open(trace, "w") as f:
        f.write("t_seconds,rate\n0,%d\n1000000,%d\n" % (a.rate, a.rate))
    load0 = open("/proc/loadavg").read().split()[0]
    loadlog = open(os.path.join(a.workdir, a.output + ".load.log"), "w")
    # The load runs from the start; records produced in the first `warmup` seconds (the job
    # starting and catching up) are not measured.
    t_start = time.time()
    lp = subprocess.Popen([a.streamscale_bin, "load", "--brokers", a.brokers, "--topic", a.input,
                           "--trace", trace, "--keys", str(a.keys),
                           "--duration", str(a.warmup + a.duration)],
                          stdout=loadlog, stderr=subprocess.STDOUT)
    run = start(a, a.output, a.checkpoint_ms)
    while lp.poll() is None:
        w.poll()
    n = end_offsets(a.brokers, a.input)
    deadline = time.time() + 60
    while w.count < n and time.time() < deadline:
        w.poll()
    run.stop()
    w.close()
    load1 = open("/proc/loadavg").read().split()[0]
    times = input_times(a.brokers, a.input)
    lat = []
    seen = {}
    t_measured = t_start + a.warmup
    for t, k, cnt in w.arrivals:
        i = seen.get(k, 0)
        for tp in times.get(k, [])[i:i + cnt]:
            if tp >= t_measured:
                lat.append(t - tp)
        seen[k] = i + cnt
    lat.sort()

    def q(x):
        return round(lat[min(len(lat) - 1, int(x * len(lat)))] * 1000) if lat else None

    res = {"side": a.side, "parallelism": a.parallelism, "checkpoint_ms": a.checkpoint_ms,
           "rate": a.rate, "records": n, "committed": w.count, "measured": len(lat), "p50_ms": q(0.50), "p99_ms": q(0.99),
           "max_ms": round(lat[-1] * 1000) if lat else None, "load_before": load0, "load_after": load1}
    print(json.dumps(res), flush=True)
    return 0 if w.count == n and lat else 1


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def cmd_summary(path):
    """Markdown tables of a results.jsonl: throughput per parallelism, checkpoint overhead,
    latency."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    thr = [r for r in rows if "records_per_s" in r and r.get("done") == "committed"]
    if thr:
        print("| parallelism | streamscale records/s | Flink records/s | ratio | "
              "streamscale records/CPU-s | Flink records/CPU-s | ratio | load (1 min) |")
        print("|---|---|---|---|---|---|---|---|")
        for p in sorted({r["parallelism"] for r in thr}):
            e = [r for r in thr if r["side"] == "engine" and r["parallelism"] == p]
            f = [r for r in thr if r["side"] == "flink" and r["parallelism"] == p]
            er, fr = mean([r["records_per_s"] for r in e]), mean([r["records_per_s"] for r in f])
            ec, fc = mean([r["records_per_cpu_s"] for r in e]), mean([r["records_per_cpu_s"] for r in f])
            runs = lambda rs, k: " / ".join("%dk" % round(r[k] / 1000) for r in rs)
            print("| %d | %s | %s | %.2f | %s | %s | %.2f | %s |" % (
                p, runs(e, "records_per_s"), runs(f, "records_per_s"), er / fr,
                runs(e, "records_per_cpu_s"), runs(f, "records_per_cpu_s"), ec / fc,
                " ".join(r["load_before"] for r in e + f)))
        bad = [r for r in thr if not r["verified"]]
        print("\nper-key totals (read_committed) equal to the input's: %s" % (
            "all runs" if not bad else "NOT in %d runs" % len(bad)))
    ck = [r for r in rows if r.get("done") == "consumed"]
    if ck:
        print("\n| checkpoint interval | records/s (runs) | records/CPU-s | load (1 min) |")
        print("|---|---|---|---|")
        for ms in sorted({r["checkpoint_ms"] for r in ck}):
            rs = [r for r in ck if r["checkpoint_ms"] == ms]
            print("| %g s | %s | %s | %s |" % (
                ms / 1000, " / ".join("%dk" % round(r["records_per_s"] / 1000) for r in rs),
                " / ".join("%dk" % round(r["records_per_cpu_s"] / 1000) for r in rs),
                " ".join(r["load_before"] for r in rs)))
    lat = [r for r in rows if "p99_ms" in r]
    if lat:
        print("\n| side | rate | records | p50 ms | p99 ms | max ms | load (1 min) |")
        print("|---|---|---|---|---|---|---|")
        for r in lat:
            print("| %s | %d/s | %d | %s | %s | %s | %s |" % (
                r["side"], r["rate"], r["records"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                r["load_before"]))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("topic")
    t.add_argument("brokers")
    t.add_argument("name")
    t.add_argument("partitions", type=int)
    sm = sub.add_parser("summary")
    sm.add_argument("results")
    s = sub.add_parser("size")
    s.add_argument("brokers")
    s.add_argument("topic")
    for name in ("throughput", "latency"):
        r = sub.add_parser(name)
        r.add_argument("--side", choices=["engine", "flink"], required=True)
        r.add_argument("--brokers", required=True)
        r.add_argument("--input", required=True)
        r.add_argument("--output", required=True)
        r.add_argument("--parallelism", type=int, default=1)
        r.add_argument("--checkpoint-ms", type=int, default=1000)
        r.add_argument("--keys", type=int, default=1000)
        r.add_argument("--out-partitions", type=int, default=2)
        r.add_argument("--in-partitions", type=int, default=4)
        r.add_argument("--workdir", required=True)
        r.add_argument("--engine-bin")
        r.add_argument("--streamscale-bin")
        r.add_argument("--flink-rest")
        r.add_argument("--flink-jar-id")
        r.add_argument("--flink-pid-files", nargs="*", default=[])
        r.add_argument("--timeout", type=float, default=600)
        r.add_argument("--verify", action="store_true")
        r.add_argument("--done", choices=["committed", "consumed"], default="committed")
        r.add_argument("--rate", type=int, default=10000)
        r.add_argument("--duration", type=float, default=60)
        r.add_argument("--warmup", type=float, default=10)
    a = ap.parse_args()
    if a.cmd == "topic":
        create_topic(a.brokers, a.name, a.partitions)
        return 0
    if a.cmd == "summary":
        return cmd_summary(a.results)
    if a.cmd == "size":
        print(end_offsets(a.brokers, a.topic))
        return 0
    return cmd_throughput(a) if a.cmd == "throughput" else cmd_latency(a)


if __name__ == "__main__":
    sys.exit(main())
