#!/usr/bin/env bash
# A real Apache Flink 2.3.0 standalone session cluster on loopback, for the Flink backend's
# integration tests, plus the project's demo job (flink-jobs/trace-job).
#
#   scripts/flink-testenv.sh install                  fetch Flink, assemble FLINK_HOME, build the job jar,
#                                                     and a PyFlink venv (for the PyFlink test)
#   scripts/flink-testenv.sh start [--scheduler adaptive|default]
#                                                     start 1 JobManager + 1 TaskManager (4 slots)
#   scripts/flink-testenv.sh stop                     stop both (no error when not running)
#   scripts/flink-testenv.sh env                      print FLINK_HOME, FLINK_DEMO_JAR, FLINK_REST_URL,
#                                                     FLINK_SAVEPOINT_DIR, FLINK_CONF_DIR, FLINK_PYTHON,
#                                                     FLINK_KAFKA_JOB_JAR lines (for eval)
#   scripts/flink-testenv.sh submit [job args...]     upload the demo jar by REST, run it, print the job id
#
# Needs Java 17 (java, javac, jar), python3, curl, unzip; pip reaching PyPI and mvn reaching Maven
# Central (the Kafka connector of the Kafka-fed job, bench/kafka-flink/flink-job) on the first `install`.
# Flink has no tarball on PyPI, but two wheels together make a FLINK_HOME: apache-flink-libraries
# (lib/, opt/, plugins/, ~330 MB) and apache-flink (bin/*.sh, conf/). Everything is cached in
# $STREAMSCALE_CACHE/flink (default ~/.cache/streamscale/flink); a second `install` is a no-op, and
# the job jar is rebuilt only when a source under flink-jobs/trace-job is newer than it.
# Cluster files (config, logs, pids, tmp, checkpoints, savepoints) live in $FLINK_RUN_DIR (default
# $CACHE/run; its conf/ is the FLINK_CONF_DIR; FLINK_HOME/conf is left as shipped); every socket
# binds 127.0.0.1.
# Ports: REST $FLINK_REST_PORT (default 8081); ten more from $FLINK_PORT_BASE (default 6121), checked
# free: data B, TM RPC B+1, JM RPC B+2, blob B+3, metric query services B+4 (JM) and B+5..B+9 (TMs).
# A second cluster beside the first: another FLINK_REST_PORT, FLINK_PORT_BASE and FLINK_RUN_DIR.
# Cluster: 1 JobManager (1024m), 1 TaskManager (1280m, 4 slots), adaptive scheduler (or default)
# with 5 s stabilization and cooldown, hashmap state, checkpoints every 5 s, unlimited restarts
# (fixed delay 1 s). FLINK_EXTRA_CONFIG="key: value" lines are appended to the config (and win),
# e.g. "metrics.fetcher.update-interval: 1s" and "rest.cache.execution-graph.timeout: 0s" for
# fresher REST answers than Flink's defaults (10 s and 3 s).
#
# The demo job (entry class streamscale.tracejob.TraceJob; run it with --help for its arguments):
# FLIP-27 source following a rate or a trace (reports pendingRecords) -> HASH -> keyed counter burning
# 300 us per record -> discarding sink. Vertices "Source: trace" (id eaac0c0245622e7be276a71314246798)
# and "count -> discard: Writer" (id b71731f1c0df9c3076c4a455334d0ad6); the ids come from the
# operators' fixed uids and are the same in every submission.
#
# Resubmitting from a savepoint at other per-vertex parallelism (all tested on 2.3.0):
#   Flink 2.x clients submit a StreamGraph, and the dispatcher applies
#   pipeline.jobvertex-parallelism-overrides only to JobGraphs (FLINK-38770): for a job that does
#   nothing about it the key is silently ignored, by `bin/flink run -D...` and by the
#   "flinkConfiguration" of POST /jars/<id>/run alike (the savepoint itself is restored).
#   The demo job reads the key from its configuration and sets its operators' parallelism itself,
#   so this works and answers with the job id (the route to use):
#     POST /jars/<jar-id>/run
#     {"entryClass": "streamscale.tracejob.TraceJob",
#      "programArgsList": ["--epoch-ms", "<epoch-ms of the first run>", <same args as before>],
#      "savepointPath": "file:/.../savepoints/savepoint-xxxxxx-yyyyyyyyyyyy",
#      "flinkConfiguration": {"pipeline.jobvertex-parallelism-overrides": "<vid>:<p>,<vid>:<p>"}}
#   ("execution.state-recovery.path" inside "flinkConfiguration" works in place of "savepointPath".
#   The epoch is in GET /jobs/<jid>/config, execution-config.user-config.epoch-ms.)
#   The CLI equivalent: FLINK_CONF_DIR=$CACHE/run/conf "$FLINK_HOME/bin/flink" run -d
#     -Dexecution.state-recovery.path=SP -Dpipeline.jobvertex-parallelism-overrides=VID:P,VID:P
#     -c streamscale.tracejob.TraceJob "$FLINK_DEMO_JAR" --epoch-ms E ...
#   `--jobgraph` (the recipe's workaround: the job compiles and submits a JobGraph itself, with its
#   jar) also works from the CLI; the dispatcher then applies the overrides ("Changing job vertex
#   ... parallelism" in its log). Through POST /jars/<id>/run with --jobgraph --rest URL --restore SP
#   --overrides ... the job starts too, but the call answers 400 "No jobs included in application"
#   without the job id. For a foreign job: restore, then PUT /jobs/<jid>/resource-requirements.
set -euo pipefail

FLINK_VERSION=2.3.0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="${STREAMSCALE_CACHE:-$HOME/.cache/streamscale}/flink"
FH="$CACHE/flink-$FLINK_VERSION"
RUN="${FLINK_RUN_DIR:-$CACHE/run}"
REST_PORT="${FLINK_REST_PORT:-8081}"
JOB_SRC="$ROOT/flink-jobs/trace-job/src/main/java"
JOB_BUILD="$CACHE/trace-job"
JAR="$JOB_BUILD/trace-job.jar"
ENTRY=streamscale.tracejob.TraceJob
PB="${FLINK_PORT_BASE:-6121}"
[[ "$PB" =~ ^[0-9]+$ ]] && ((PB >= 1024 && PB <= 65526)) || {
  echo "flink-testenv: error: FLINK_PORT_BASE must be a port number from 1024 to 65526, not '$PB'" >&2
  exit 2
}
FIXED_PORTS=($(seq "$PB" $((PB + 9))))

log() { echo "flink-testenv: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
# shellcheck source=mvn-deps.sh
. "$ROOT/scripts/mvn-deps.sh"

need() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null || die "$c is not installed (needed: java 17 JDK, python3, curl, unzip)"; done
}

# ---------------------------------------------------------------------------------- install
assemble_home() {
  [[ -f "$FH/lib/flink-dist-$FLINK_VERSION.jar" && -x "$FH/bin/jobmanager.sh" ]] && return 0
  need pip python3 unzip
  local dl="$CACHE/dl" t0=$SECONDS
  mkdir -p "$dl"
  log "downloading apache-flink-libraries==$FLINK_VERSION and apache-flink==$FLINK_VERSION wheels (~330 MB)"
  compgen -G "$dl/apache_flink_libraries-$FLINK_VERSION-*.whl" >/dev/null ||
    pip download -q --no-deps "apache-flink-libraries==$FLINK_VERSION" -d "$dl" ||
    die "pip download apache-flink-libraries==$FLINK_VERSION failed"
  # apache-flink is a per-Python-version wheel; its bin/ and conf/ are the same in all of them.
  compgen -G "$dl/apache_flink-$FLINK_VERSION-*.whl" >/dev/null ||
    pip download -q --no-deps "apache-flink==$FLINK_VERSION" -d "$dl" ||
    pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
      "apache-flink==$FLINK_VERSION" -d "$dl" ||
    die "pip download apache-flink==$FLINK_VERSION failed"
  local tmp="$CACHE/assemble.tmp" libs apf
  libs=$(compgen -G "$dl/apache_flink_libraries-$FLINK_VERSION-*.whl" | head -1)
  apf=$(compgen -G "$dl/apache_flink-$FLINK_VERSION-*.whl" | head -1)
  rm -rf "$tmp" "$FH"
  mkdir -p "$tmp/home"
  unzip -q "$libs" 'pyflink/lib/*' 'pyflink/opt/*' 'pyflink/plugins/*' 'pyflink/bin/*' -d "$tmp/libs"
  unzip -q "$apf" 'pyflink/bin/*' 'pyflink/conf/*' -d "$tmp/apf"
  cp -r "$tmp/libs/pyflink/lib" "$tmp/libs/pyflink/opt" "$tmp/libs/pyflink/plugins" "$tmp/home/"
  mkdir -p "$tmp/home/bin"
  cp "$tmp"/apf/pyflink/bin/* "$tmp"/libs/pyflink/bin/* "$tmp/home/bin/"
  cp -r "$tmp/apf/pyflink/conf" "$tmp/home/"
  cp "$tmp/home/conf/config.yaml" "$tmp/home/conf/config.yaml.orig"
  chmod +x "$tmp"/home/bin/*.sh "$tmp/home/bin/flink"
  mv "$tmp/home" "$FH"
  rm -rf "$tmp"
  log "assembled $FH in $((SECONDS - t0)) s"
}

build_job() {
  local srcs newest=0
  mapfile -t srcs < <(find "$JOB_SRC" -name '*.java' | sort)
  ((${#srcs[@]})) || die "no Java sources under $JOB_SRC"
  if [[ -f "$JAR" ]]; then
    local f stale=0
    for f in "${srcs[@]}"; do [[ "$f" -nt "$JAR" ]] && stale=1; done
    ((stale)) || return 0
  fi
  need javac jar
  log "building $JAR"
  rm -rf "$JOB_BUILD/classes"
  mkdir -p "$JOB_BUILD/classes"
  javac --release 17 -Xlint:-options -nowarn -cp "$FH/lib/*" -d "$JOB_BUILD/classes" "${srcs[@]}" ||
    die "javac failed for $JOB_SRC"
  rm -f "$JAR.tmp"
  jar --create --file "$JAR.tmp" --main-class "$ENTRY" -C "$JOB_BUILD/classes" .
  mv "$JAR.tmp" "$JAR"
}

# PyFlink (the apache-flink package, ~850 MB with its dependencies) in a venv of the cache, for
# the test that runs a PyFlink job; the wheels downloaded for FLINK_HOME are reused.
PYVENV="$CACHE/pyflink-venv"
install_pyflink() {
  if [[ -x "$PYVENV/bin/python" ]] && "$PYVENV/bin/python" -c 'import pyflink' 2>/dev/null; then
    return 0
  fi
  log "installing PyFlink $FLINK_VERSION into $PYVENV"
  rm -rf "$PYVENV"
  python3 -m venv "$PYVENV" || die "python3 -m venv $PYVENV failed"
  "$PYVENV/bin/pip" install -q --disable-pip-version-check --find-links "$CACHE/dl" \
    "apache-flink==$FLINK_VERSION" || die "pip install apache-flink==$FLINK_VERSION failed"
}

# The Kafka-fed job (bench/kafka-flink/flink-job: KafkaSource -> keyBy -> 1 s window ->
# exactly-once KafkaSink) with flink-connector-kafka and kafka-clients inside its jar (Flink's lib/
# has neither); the connector and its dependencies from Maven Central with mvn, cached.
KAFKA_CONNECTOR_VERSION="${FLINK_KAFKA_CONNECTOR_VERSION:-5.0.0-2.2}"
KAFKA_LIB="$CACHE/kafka-connector-$KAFKA_CONNECTOR_VERSION"
KAFKA_JOB_SRC="$ROOT/bench/kafka-flink/flink-job/src/main/java"
KAFKA_JAR="$CACHE/kafka-job-$KAFKA_CONNECTOR_VERSION/kafka-window-sum.jar"
install_kafka_job() {
  if [[ ! -f "$KAFKA_LIB/.complete" ]]; then
    need mvn
    local work="$CACHE/kafka-connector-pom-$KAFKA_CONNECTOR_VERSION"
    mkdir -p "$work"
    cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamscale</groupId>
  <artifactId>flink-kafka-connector</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.flink</groupId>
      <artifactId>flink-connector-kafka</artifactId>
      <version>$KAFKA_CONNECTOR_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    log "fetching org.apache.flink:flink-connector-kafka:$KAFKA_CONNECTOR_VERSION and its dependencies with mvn"
    mvn_copy_dependencies "$work" "$KAFKA_LIB" 'kafka-clients-*.jar'
  fi
  local srcs f d
  mapfile -t srcs < <(find "$KAFKA_JOB_SRC" -name '*.java' | sort)
  if [[ -f "$KAFKA_JAR" ]]; then
    local stale=0
    for f in "${srcs[@]}"; do [[ "$f" -nt "$KAFKA_JAR" ]] && stale=1; done
    ((stale)) || return 0
  fi
  need javac jar unzip
  log "building $KAFKA_JAR"
  d=$(dirname "$KAFKA_JAR")
  rm -rf "$d"
  mkdir -p "$d/classes"
  javac --release 17 -Xlint:-options -nowarn -cp "$FH/lib/*:$KAFKA_LIB/*" -d "$d/classes" "${srcs[@]}" ||
    die "javac failed for $KAFKA_JOB_SRC"
  for f in "$KAFKA_LIB"/*.jar; do
    case "$(basename "$f")" in slf4j-*) continue ;; esac
    (cd "$d/classes" && unzip -qo "$f" -x 'META-INF/MANIFEST.MF' '*module-info.class' 2>/dev/null) || true
  done
  jar --create --file "$KAFKA_JAR.tmp" --main-class streamscale.bench.KafkaWindowSum -C "$d/classes" .
  mv "$KAFKA_JAR.tmp" "$KAFKA_JAR"
  rm -rf "$d/classes"
}

cmd_install() {
  need java python3
  assemble_home
  build_job
  install_pyflink
  install_kafka_job
}

# ---------------------------------------------------------------------------------- start/stop
rest_url() { echo "http://127.0.0.1:$REST_PORT"; }

listening() { # listening PORT -> 0 when something accepts connections on 127.0.0.1:PORT
  python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.settimeout(0.5)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
}

pids_of() { # the pids Flink's daemon scripts recorded
  cat "$RUN"/pid/*.pid 2>/dev/null || true
}

running() {
  local p
  for p in $(pids_of); do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

write_config() {
  local scheduler=$1 jopts
  jopts=$(sed -n 's/^ *all: //p' "$FH/conf/config.yaml.orig")
  mkdir -p "$RUN"/{log,pid,tmp,web,checkpoints,savepoints}
  cat >"$RUN/conf/config.yaml" <<EOF
# written by scripts/flink-testenv.sh start
env.java.opts.all: $jopts -Djava.io.tmpdir=$RUN/tmp
env.log.dir: $RUN/log
env.pid.dir: $RUN/pid
io.tmp.dirs: $RUN/tmp
web.tmpdir: $RUN/web
blob.storage.directory: $RUN/tmp

jobmanager.bind-host: 127.0.0.1
jobmanager.rpc.address: 127.0.0.1
jobmanager.rpc.port: $((PB + 2))
jobmanager.memory.process.size: 1024m
jobmanager.execution.failover-strategy: region
jobmanager.scheduler: $scheduler
jobmanager.adaptive-scheduler.resource-stabilization-timeout: 5s
jobmanager.adaptive-scheduler.submission.resource-stabilization-timeout: 5s
jobmanager.adaptive-scheduler.executing.resource-stabilization-timeout: 5s
jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: 5s

taskmanager.bind-host: 127.0.0.1
taskmanager.host: 127.0.0.1
taskmanager.rpc.port: $((PB + 1))
taskmanager.data.port: $PB
taskmanager.numberOfTaskSlots: 4
taskmanager.memory.process.size: 1280m
taskmanager.memory.managed.size: 64m
taskmanager.memory.network.min: 64m
taskmanager.memory.network.max: 64m

rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.port: $REST_PORT
blob.server.port: $((PB + 3))
# TaskManagers' metric query services; the JobManager's gets $((PB + 4)) on its command line, so that
# the TaskManager does not first try (and fail) to bind the JobManager's port.
metrics.internal.query-service.port: $((PB + 5))-$((PB + 9))

parallelism.default: 1
restart-strategy.type: fixed-delay
restart-strategy.fixed-delay.attempts: 1000000
restart-strategy.fixed-delay.delay: 1s
state.backend.type: hashmap
execution.checkpointing.interval: 5s
execution.checkpointing.dir: file://$RUN/checkpoints
execution.checkpointing.savepoint-dir: file://$RUN/savepoints
EOF
  if [[ -n "${FLINK_EXTRA_CONFIG:-}" ]]; then
    # Extra "key: value" lines win over the ones above (a key may appear only once in the file).
    local key
    for key in $(sed -n 's/^\([A-Za-z0-9_.-]*\):.*/\1/p' <<<"$FLINK_EXTRA_CONFIG"); do
      sed -i "/^${key//./\\.}:/d" "$RUN/conf/config.yaml"
    done
    printf '\n# FLINK_EXTRA_CONFIG\n%s\n' "$FLINK_EXTRA_CONFIG" >>"$RUN/conf/config.yaml"
  fi
  # The daemon scripts read conf/ next to the config (log4j files etc.).
  local f
  for f in "$FH"/conf/*; do
    [[ "$(basename "$f")" == config.yaml* ]] || cp "$f" "$RUN/conf/"
  done
}

cmd_start() {
  local scheduler=adaptive
  while (($#)); do
    case "$1" in
      --scheduler)
        scheduler=${2:-}
        shift 2 || true
        ;;
      --scheduler=*)
        scheduler=${1#*=}
        shift
        ;;
      *) die "start: unknown argument $1 (usage: start [--scheduler adaptive|default])" ;;
    esac
  done
  [[ "$scheduler" == adaptive || "$scheduler" == default ]] ||
    die "start: --scheduler must be adaptive or default, not '$scheduler'"
  need java python3 curl
  [[ -f "$FH/lib/flink-dist-$FLINK_VERSION.jar" && -f "$JAR" ]] || cmd_install
  build_job
  if running; then
    die "a cluster started by this script is already running (pids $(pids_of | tr '\n' ' ')); run '$0 stop' first"
  fi
  listening "$REST_PORT" && die "something already listens on 127.0.0.1:$REST_PORT (set FLINK_REST_PORT to another port)"
  local p
  for p in "${FIXED_PORTS[@]}"; do
    listening "$p" && die "port 127.0.0.1:$p (Flink RPC/data/blob/query) is taken by another process"
  done
  rm -rf "$RUN/log" "$RUN/pid" "$RUN/tmp" "$RUN/web" "$RUN/conf"
  mkdir -p "$RUN/conf"
  write_config "$scheduler"
  local t0=$SECONDS
  export FLINK_CONF_DIR="$RUN/conf" FLINK_LOG_DIR="$RUN/log" FLINK_PID_DIR="$RUN/pid"
  "$FH/bin/jobmanager.sh" start -D metrics.internal.query-service.port=$((PB + 4)) >"$RUN/log/start-jobmanager.out" 2>&1 ||
    die "jobmanager.sh start failed; see $RUN/log/start-jobmanager.out"
  "$FH/bin/taskmanager.sh" start >"$RUN/log/start-taskmanager.out" 2>&1 ||
    die "taskmanager.sh start failed; see $RUN/log/start-taskmanager.out"
  local slots="" i
  for ((i = 0; i < 300; i++)); do
    slots=$(curl -fs --max-time 2 "$(rest_url)/overview" |
      python3 -c 'import sys,json; print(json.load(sys.stdin)["slots-total"])' 2>/dev/null || true)
    [[ "$slots" == 4 ]] && break
    sleep 0.2
  done
  if [[ "$slots" != 4 ]]; then
    local jm tm
    jm=$(compgen -G "$RUN/log/flink-*-standalonesession-*.log" | head -1 || true)
    tm=$(compgen -G "$RUN/log/flink-*-taskexecutor-*.log" | head -1 || true)
    log "error: the cluster did not offer 4 slots at $(rest_url)/overview within 60 s (slots: ${slots:-no answer})"
    log "JobManager log: ${jm:-$RUN/log (none written)}"
    log "TaskManager log: ${tm:-$RUN/log (none written)}"
    [[ -n "$jm" ]] && tail -n 20 "$jm" >&2
    exit 1
  fi
  log "cluster up in $((SECONDS - t0)) s ($scheduler scheduler, 4 slots); logs in $RUN/log"
  echo "FLINK_REST_URL=$(rest_url)"
  echo "FLINK_SAVEPOINT_DIR=$RUN/savepoints"
}

stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  kill -9 "$pid" 2>/dev/null || true
}

cmd_stop() {
  local pids p
  pids=$(pids_of)
  if [[ -x "$FH/bin/taskmanager.sh" && -d "$RUN/conf" ]]; then
    export FLINK_CONF_DIR="$RUN/conf" FLINK_LOG_DIR="$RUN/log" FLINK_PID_DIR="$RUN/pid"
    "$FH/bin/taskmanager.sh" stop-all >/dev/null 2>&1 || true
    "$FH/bin/jobmanager.sh" stop-all >/dev/null 2>&1 || true
  fi
  # Leftovers (the daemon scripts give up after a while, or lost their pid file).
  for p in $pids; do stop_pid "$p"; done
  rm -f "$RUN"/pid/*.pid
  log "stopped"
}

# ---------------------------------------------------------------------------------- env/submit
cmd_env() {
  echo "FLINK_HOME=$FH"
  echo "FLINK_DEMO_JAR=$JAR"
  echo "FLINK_REST_URL=$(rest_url)"
  echo "FLINK_SAVEPOINT_DIR=$RUN/savepoints"
  echo "FLINK_CONF_DIR=$RUN/conf"
  echo "FLINK_PYTHON=$PYVENV/bin/python"
  echo "FLINK_KAFKA_JOB_JAR=$KAFKA_JAR"
}

cmd_submit() {
  need curl python3
  [[ -f "$JAR" ]] || die "no job jar at $JAR; run '$0 install'"
  build_job
  local url up jar_id body resp
  url=$(rest_url)
  curl -fs --max-time 2 "$url/overview" >/dev/null || die "no Flink cluster answers at $url; run '$0 start'"
  up=$(curl -sS --max-time 60 -X POST -F "jarfile=@$JAR" "$url/jars/upload") || die "jar upload to $url failed"
  jar_id=$(python3 -c 'import sys,json; print(json.loads(sys.argv[1])["filename"].rsplit("/",1)[-1])' "$up" 2>/dev/null) ||
    die "unexpected /jars/upload answer: $up"
  body=$(python3 -c 'import sys,json; print(json.dumps({"entryClass": sys.argv[1], "programArgsList": sys.argv[2:]}))' "$ENTRY" "$@")
  resp=$(curl -sS --max-time 120 -X POST -H 'Content-Type: application/json' -d "$body" "$url/jars/$jar_id/run") ||
    die "POST /jars/$jar_id/run failed"
  python3 -c 'import sys,json; print(json.loads(sys.argv[1])["jobid"])' "$resp" 2>/dev/null ||
    die "job submission failed: $resp"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start "${@:2}" ;;
  stop) cmd_stop ;;
  env) cmd_env ;;
  submit) cmd_submit "${@:2}" ;;
  *)
    echo "usage: $0 install|start [--scheduler adaptive|default]|stop|env|submit [job args...]" >&2
    exit 2
    ;;
esac
