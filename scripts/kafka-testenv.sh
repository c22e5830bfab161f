#!/usr/bin/env bash
# A real Apache Kafka 4.1 broker (KRaft, one node acting as broker and controller) on loopback,
# for the engine's Kafka tests and the Kafka example.
#
#   scripts/kafka-testenv.sh install   fetch org.apache.kafka:kafka_2.13 and its dependencies from
#                                      Maven Central (mvn dependency:copy-dependencies) into the cache
#   scripts/kafka-testenv.sh start     format a fresh log directory with kafka.tools.StorageTool and
#                                      start `kafka.Kafka server.properties`; prints KAFKA_BROKERS=...
#   scripts/kafka-testenv.sh stop      stop the broker (no error when not running) and remove its data
#   scripts/kafka-testenv.sh env       print KAFKA_LIBS, KAFKA_BROKERS, KAFKA_SASL_BROKERS,
#                                      KAFKA_SASL_USER, KAFKA_SASL_PASSWORD, KAFKA_RUN lines (for eval)
#   scripts/kafka-testenv.sh create-topic NAME PARTITIONS
#                                      create a topic on the running broker (Kafka's TopicCommand)
#
# Needs Java 17 (java) and Maven (mvn); mvn reaching Maven Central on the first `install` (about
# 55 MB; later runs reuse $CACHE). Everything lives in $STREAMSCALE_CACHE/kafka (default
# ~/.cache/streamscale/kafka): the jars in lib-$VERSION/, the running broker's config, log, pid and
# data in run/ (or in $KAFKA_RUN_DIR: with it and other ports a second broker runs beside the
# first on the same jars; `stop` then removes that directory). Ports: broker $KAFKA_PORT (default 39092, PLAINTEXT), controller
# $KAFKA_CONTROLLER_PORT (default 39093), a SASL_PLAINTEXT listener (mechanism PLAIN, one test
# user `streamscale` with the test-only password `streamscale-test-password`, no authorizer) on
# $KAFKA_SASL_PORT (default 39094), all on 127.0.0.1 and checked free before starting. Single-node settings:
# replication factor 1 (and min ISR 1) for __consumer_offsets and __transaction_state, no
# initial rebalance delay, transactions open longer than their timeout aborted within 1 s (not
# 10 s), topics auto-created off (a test creates what it needs), 6 partitions by default. KAFKA_VERSION picks another 4.x version (default 4.1.1).
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="${STREAMSCALE_CACHE:-$HOME/.cache/streamscale}/kafka"
LIB="$CACHE/lib-$KAFKA_VERSION"
RUN="${KAFKA_RUN_DIR:-$CACHE/run}"
PORT="${KAFKA_PORT:-39092}"
CPORT="${KAFKA_CONTROLLER_PORT:-39093}"
SPORT="${KAFKA_SASL_PORT:-39094}"
# Test-only credentials of the SASL listener.
SASL_USER=streamscale
SASL_PASSWORD=streamscale-test-password

log() { echo "kafka-testenv: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
# shellcheck source=mvn-deps.sh
. "$ROOT/scripts/mvn-deps.sh"
need() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null || die "$c is not installed (needed: java 17, mvn)"; done
}

# ---------------------------------------------------------------------------------- install
cmd_install() {
  need java mvn
  if [[ -f "$LIB/.complete" ]] && compgen -G "$LIB/kafka-tools-$KAFKA_VERSION.jar" >/dev/null; then
    return 0
  fi
  local t0=$SECONDS work="$CACHE/pom-$KAFKA_VERSION"
  mkdir -p "$work"
  # kafka_2.13 is the broker (kafka.Kafka, kafka.tools.StorageTool); log4j-core and the slf4j 2
  # binding are the logging backend Kafka's own distribution ships (slf4j-api pinned to 2.x: a
  # dependency would otherwise bring 1.7, which finds no binding and logs nothing).
  cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamscale</groupId>
  <artifactId>kafka-testenv</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>2.0.17</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
EOF
  log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its dependencies with mvn"
  mvn_copy_dependencies "$work" "$LIB" "kafka_2.13-$KAFKA_VERSION.jar"
  log "installed $(find "$LIB" -name '*.jar' | wc -l) jars in $LIB in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------- start/stop
listening() { # listening PORT -> 0 when something accepts connections on 127.0.0.1:PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pid_running() {
  [[ -f "$RUN/kafka.pid" ]] && kill -0 "$(cat "$RUN/kafka.pid")" 2>/dev/null
}

write_config() {
  mkdir -p "$RUN"
  cat >"$RUN/server.properties" <<EOF
# written by scripts/kafka-testenv.sh start
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT,SASL_PLAINTEXT://127.0.0.1:$SPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,SASL_PLAINTEXT://127.0.0.1:$SPORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
inter.broker.listener.name=PLAINTEXT
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$SASL_PASSWORD";
log.dirs=$RUN/data
num.partitions=6
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
log.retention.hours=1
log.segment.bytes=16777216
EOF
  cat >"$RUN/log4j2.properties" <<EOF
appender.file.type = File
appender.file.name = file
appender.file.fileName = $RUN/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
EOF
}

cmd_start() {
  need java
  [[ -f "$LIB/.complete" ]] || cmd_install
  pid_running && die "a broker started by this script is already running (pid $(cat "$RUN/kafka.pid")); run '$0 stop' first"
  listening "$PORT" && die "something already listens on 127.0.0.1:$PORT (set KAFKA_PORT to another port)"
  listening "$CPORT" && die "something already listens on 127.0.0.1:$CPORT (set KAFKA_CONTROLLER_PORT to another port)"
  listening "$SPORT" && die "something already listens on 127.0.0.1:$SPORT (set KAFKA_SASL_PORT to another port)"
  rm -rf "$RUN"
  write_config
  local t0=$SECONDS cp="$LIB/*"
  local jopts=(-Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$RUN/log4j2.properties" "-Djava.io.tmpdir=$RUN")
  # A fixed cluster id: the log directory is new on every start.
  java "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool format -t streamscaleTestKafka0w \
    -c "$RUN/server.properties" >"$RUN/format.out" 2>&1 ||
    {
      cat "$RUN/format.out" >&2
      die "kafka.tools.StorageTool format failed"
    }
  nohup java "${jopts[@]}" -cp "$cp" kafka.Kafka "$RUN/server.properties" >"$RUN/stdout.log" 2>&1 </dev/null &
  echo $! >"$RUN/kafka.pid"
  local i
  for ((i = 0; i < 300; i++)); do
    if ! pid_running; then
      tail -n 30 "$RUN/stdout.log" "$RUN/server.log" >&2 2>/dev/null || true
      die "the broker exited while starting (logs: $RUN/stdout.log, $RUN/server.log)"
    fi
    if listening "$PORT" && grep -q "Kafka Server started\|\[KafkaRaftServer nodeId=1\] Kafka Server started" "$RUN/server.log" 2>/dev/null; then
      log "broker up in $((SECONDS - t0)) s on 127.0.0.1:$PORT (logs in $RUN)"
      echo "KAFKA_BROKERS=127.0.0.1:$PORT"
      return 0
    fi
    sleep 0.2
  done
  tail -n 30 "$RUN/server.log" >&2 2>/dev/null || true
  die "the broker did not start within 60 s (log: $RUN/server.log)"
}

cmd_stop() {
  if pid_running; then
    local pid i
    pid=$(cat "$RUN/kafka.pid")
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$RUN"
  log "stopped"
}

cmd_env() {
  echo "KAFKA_LIBS=$LIB"
  echo "KAFKA_BROKERS=127.0.0.1:$PORT"
  echo "KAFKA_SASL_BROKERS=127.0.0.1:$SPORT"
  echo "KAFKA_SASL_USER=$SASL_USER"
  echo "KAFKA_SASL_PASSWORD=$SASL_PASSWORD"
  echo "KAFKA_RUN=$RUN"
}

cmd_create_topic() {
  local name=${1:-} parts=${2:-}
  [[ -n "$name" && "$parts" =~ ^[0-9]+$ ]] || die "usage: $0 create-topic NAME PARTITIONS"
  pid_running || die "no broker started by this script is running; run '$0 start'"
  java -Xmx256m "-Dlog4j2.configurationFile=$RUN/log4j2.properties" -cp "$LIB/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$PORT" --create \
    --if-not-exists --topic "$name" --partitions "$parts" --replication-factor 1 >&2 ||
    die "cannot create topic $name"
}

case "${1:-}" in
  install) cmd_install ;;
  create-topic) cmd_create_topic "${@:2}" ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) cmd_env ;;
  *)
    echo "usage: $0 install|start|stop|env|create-topic NAME PARTITIONS" >&2
    exit 2
    ;;
esac
