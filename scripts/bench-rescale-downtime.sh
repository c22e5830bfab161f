#!/usr/bin/env bash
# bench-rescale-downtime.sh — rescale downtime (stop-with-savepoint request at parallelism 2 →
# first record processed after the restore at parallelism 3) for keyed state of several sizes,
# in streamscale-engine (heap and disk backends) and in Apache Flink 2.3 (hashmap and rocksdb
# state backends) on this machine, in one run; prints a Markdown table with the ratios.
#
# Needs: a Rust toolchain, Java 17 (java, javac, jar), python3, pip (reaching PyPI on the first
# run), curl, unzip. Flink is assembled from the `apache-flink` and `apache-flink-libraries`
# wheels under $BENCH_HOME (default ~/.cache/streamscale/flink), as scripts/bench-nexmark.sh
# does; every socket binds 127.0.0.1 (Flink's REST port 8081 must be free).
#
# Knobs: SIZES_MB (default "1 100 1000"; streamscale state = SIZE MB / 48 bytes per key keys,
#        Flink the same number of keys), REPEAT (default 3), FLINK_SIZES_MB (default: SIZES_MB),
#        FLINK_TM_MB (TaskManager process memory, default 12288), OUT (default
#        target/bench-rescale-downtime.jsonl), SETUP (streamscale disk backend before the stop:
#        `loaded`, the default: every restored key loaded into redb first; `restored`: right
#        after the restore; see engine/benches/rescale_downtime.rs), SETTLE (seconds the
#        streamscale job runs after that before the stop, default 1).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
H=${BENCH_HOME:-$HOME/.cache/streamscale/flink}
FH=$H/flink-2.3.0
RUN=$H/run
B=http://127.0.0.1:8081
SIZES_MB=${SIZES_MB:-1 100 1000}
FLINK_SIZES_MB=${FLINK_SIZES_MB:-$SIZES_MB}
REPEAT=${REPEAT:-3}
SETUP=${SETUP:-loaded}
SETTLE=${SETTLE:-1}
FLINK_TM_MB=${FLINK_TM_MB:-12288}
OUT=${OUT:-$ROOT/target/bench-rescale-downtime.jsonl}
PY=$ROOT/bench/flink/downtime.py
log() { echo "[$(date +%T)] $*" >&2; }

log "building the rescale_downtime bench (release)"
(cd "$ROOT" && cargo build -q --release -p streamscale-engine --bench rescale_downtime --bin streamscale-engine)

# shellcheck source=../bench/flink/home.sh
. "$ROOT/bench/flink/home.sh"
export FLINK_HOME=$FH FLINK_CONF_DIR=$H/conf-downtime
mkdir -p "$RUN"/{log,pid,tmp,web} "$FLINK_CONF_DIR"
cp "$FH"/conf/log4j*.properties "$FLINK_CONF_DIR"/ 2>/dev/null || true
JOPTS=$(sed -n 's/^ *all: //p' "$FH/conf/config.yaml.orig")
# Fixed-parallelism (default) scheduler; heap large enough for 1 GB of hashmap state.
cat > "$FLINK_CONF_DIR/config.yaml" <<EOC
env.java.opts.all: $JOPTS -Djava.io.tmpdir=$RUN/tmp
env.log.dir: $RUN/log
env.pid.dir: $RUN/pid
io.tmp.dirs: $RUN/tmp
web.tmpdir: $RUN/web
blob.storage.directory: $RUN/tmp
jobmanager.bind-host: 127.0.0.1
jobmanager.rpc.address: 127.0.0.1
jobmanager.rpc.port: 6123
jobmanager.memory.process.size: 1024m
taskmanager.bind-host: 127.0.0.1
taskmanager.host: 127.0.0.1
taskmanager.rpc.port: 6122
taskmanager.data.port: 6121
taskmanager.numberOfTaskSlots: 4
taskmanager.memory.process.size: ${FLINK_TM_MB}m
taskmanager.memory.managed.size: 1024m
rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.port: 8081
blob.server.port: 6124
metrics.internal.query-service.port: 6125-6130
parallelism.default: 1
execution.checkpointing.savepoint-dir: file://$RUN/savepoints
# Snapshots go to files (the default JobManager storage refuses state over 5 MB).
execution.checkpointing.storage: filesystem
execution.checkpointing.dir: file://$RUN/checkpoints
EOC

KJ=$H/keyedstatejob
SRC=$ROOT/bench/flink/downtime/src/bench/KeyedStateJob.java
if [ ! -f "$KJ/keyedstatejob.jar" ] || [ "$SRC" -nt "$KJ/keyedstatejob.jar" ]; then
  log "building keyedstatejob.jar"
  rm -rf "$KJ"; mkdir -p "$KJ/classes"
  javac --release 17 -cp "$FH/lib/*" -d "$KJ/classes" "$SRC"
  jar --create --file "$KJ/keyedstatejob.jar" -C "$KJ/classes" .
fi

if curl -sf "$B/overview" >/dev/null 2>&1; then echo "something already listens on 127.0.0.1:8081" >&2; exit 1; fi
stop_flink() { "$FH/bin/taskmanager.sh" stop >/dev/null 2>&1 || true; "$FH/bin/jobmanager.sh" stop >/dev/null 2>&1 || true; }
trap stop_flink EXIT
log "starting the Flink session cluster"
"$FH/bin/jobmanager.sh" start >/dev/null
"$FH/bin/taskmanager.sh" start >/dev/null
for _ in $(seq 1 300); do
  [ "$(curl -sf "$B/overview" | python3 -c 'import sys,json; print(json.load(sys.stdin)["slots-total"])' 2>/dev/null)" = 4 ] && break
  sleep 0.2
done
JAR=$(curl -sf -X POST -F "jarfile=@$KJ/keyedstatejob.jar" "$B/jars/upload" |
      python3 -c 'import sys,json; print(json.load(sys.stdin)["filename"].rsplit("/",1)[-1])')

BENCH=$(ls -t "$ROOT"/target/release/deps/rescale_downtime-* | grep -v '\.d$' | head -1)
: > "$OUT"
# Warm-up of Flink (class loading, JIT; not reported).
python3 "$PY" flink "$JAR" 20000 hashmap 1 "$RUN/downtime" >/dev/null
for size in $SIZES_MB; do
  keys=$(( size * 1000000 / 48 ))
  for backend in heap disk; do
    log "streamscale $backend ${size} MB ($keys keys)"
    (cd "$ROOT" && "$BENCH" --sizes-mb "$size" --backends "$backend" --repeat "$REPEAT" --setup "$SETUP" --settle-seconds "$SETTLE" \
       --dir "$ROOT/target/bench-rescale-downtime") | tee -a "$OUT" >&2
    if [[ " $FLINK_SIZES_MB " == *" $size "* ]]; then
      fb=hashmap; [ $backend = disk ] && fb=rocksdb
      log "flink $fb ${size} MB-equivalent ($keys keys)"
      python3 "$PY" flink "$JAR" "$keys" "$fb" "$REPEAT" "$RUN/downtime" | tee -a "$OUT" >&2 ||
        log "flink $fb $keys keys failed (see $RUN/log)"
    fi
  done
done
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GB RAM, $(uname -sr), $(java -version 2>&1 | head -1)"
python3 "$PY" table "$OUT"
