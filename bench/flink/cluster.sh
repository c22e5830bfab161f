# bench/flink/cluster.sh — sourced by scripts/bench-nexmark.sh and scripts/bench-overload.sh:
# assembles Flink 2.3.0 from the apache-flink wheels under $H, builds sqlrunner.jar, starts a
# local session cluster bound to 127.0.0.1 (stopped on exit) and sets TM_PID (the TaskManager
# JVM) and JAR (the uploaded sqlrunner jar's id). Expects ROOT, H, FH, RUN, B and log().
# shellcheck source=home.sh
. "$ROOT/bench/flink/home.sh"
export FLINK_HOME=$FH FLINK_CONF_DIR=$FH/conf

mkdir -p "$RUN"/{log,pid,tmp,web}
JOPTS=$(sed -n 's/^ *all: //p' "$FH/conf/config.yaml.orig")
cat > "$FH/conf/config.yaml" <<EOF
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
taskmanager.memory.process.size: 2048m
taskmanager.memory.managed.size: 128m
rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.port: 8081
blob.server.port: 6124
metrics.internal.query-service.port: 6125-6130
parallelism.default: 1
state.backend.type: hashmap
EOF

SR=$H/sqlrunner
if [ ! -f "$SR/sqlrunner.jar" ] || [ "$ROOT/bench/flink/sqlrunner/src/demo/SqlRunner.java" -nt "$SR/sqlrunner.jar" ]; then
  log "building sqlrunner.jar"
  rm -rf "$SR"; mkdir -p "$SR/classes"
  javac --release 17 -cp "$FH/lib/*" -d "$SR/classes" "$ROOT/bench/flink/sqlrunner/src/demo/SqlRunner.java"
  jar --create --file "$SR/sqlrunner.jar" --main-class demo.SqlRunner -C "$SR/classes" .
fi

# ------------------------------------------------------------------ Flink cluster
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
TM_PID=$(cat "$RUN"/pid/*taskexecutor*.pid | head -1)
JAR=$(curl -sf -X POST -F "jarfile=@$SR/sqlrunner.jar" "$B/jars/upload" |
      python3 -c 'import sys,json; print(json.load(sys.stdin)["filename"].rsplit("/",1)[-1])')

