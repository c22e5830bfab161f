#!/usr/bin/env bash
# Records the kafka-*.json answers of README.md: a Kafka broker (scripts/kafka-testenv.sh) and a
# Flink cluster (scripts/flink-testenv.sh, adaptive scheduler, 1 s metric refresh) on loopback,
# bench/kafka-flink's KafkaWindowSum job (connector fetched with mvn as bench/kafka-flink/run.sh
# does) at parallelism 2 reading a 3-partition topic that `streamscale load` fills at 20,000
# records/s; after 40 s the job, its vertices twice 10 s apart and the source's metrics. Needs
# the release build (target/release/streamscale). Leaves the cluster, broker and load running:
# stop them with scripts/flink-testenv.sh stop, scripts/kafka-testenv.sh stop.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
CONNECTOR_VERSION=5.0.0-2.2
CACHE=$HOME/.cache/streamscale/bench-kafka-flink
LIB="$CACHE/lib-$CONNECTOR_VERSION"
OUTD=${OUTD:-$(cd "$(dirname "$0")" && pwd)}
mkdir -p "$OUTD"
TMPD=$(mktemp -d)
if [[ ! -f "$LIB/.complete" ]]; then
  work="$CACHE/pom-$CONNECTOR_VERSION"; mkdir -p "$work"
  cat >"$work/pom.xml" <<P
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>streamscale</groupId><artifactId>bench-kafka-flink</artifactId><version>1</version><packaging>pom</packaging>
<dependencies><dependency><groupId>org.apache.flink</groupId><artifactId>flink-connector-kafka</artifactId><version>$CONNECTOR_VERSION</version></dependency></dependencies></project>
P
  rm -rf "$LIB.tmp"
  (cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIB.tmp" -DincludeScope=runtime > "$work/mvn.log" 2>&1)
  mv "$LIB.tmp" "$LIB"; touch "$LIB/.complete"
fi
eval "$($ROOT/scripts/flink-testenv.sh env)"
JOB_JAR=$CACHE/job-$CONNECTOR_VERSION/kafka-window-sum.jar
if [[ ! -f $JOB_JAR ]]; then
  d=$(dirname "$JOB_JAR"); rm -rf "$d"; mkdir -p "$d/classes"
  javac --release 17 -nowarn -cp "$FLINK_HOME/lib/*:$LIB/*" -d "$d/classes" $(find $ROOT/bench/kafka-flink/flink-job/src/main/java -name '*.java')
  for f in "$LIB"/*.jar; do case "$(basename "$f")" in slf4j-*) continue ;; esac; (cd "$d/classes" && unzip -qo "$f" -x 'META-INF/MANIFEST.MF' '*module-info.class' 2>/dev/null) || true; done
  jar --create --file "$JOB_JAR" --main-class streamscale.bench.KafkaWindowSum -C "$d/classes" .
  rm -rf "$d/classes"
fi
$ROOT/scripts/kafka-testenv.sh install >/dev/null
BROKERS=$($ROOT/scripts/kafka-testenv.sh start | sed -n 's/^KAFKA_BROKERS=//p')
echo "brokers $BROKERS"
$ROOT/scripts/kafka-testenv.sh create-topic rec-in 3 >/dev/null
$ROOT/scripts/kafka-testenv.sh create-topic rec-out 1 >/dev/null
FLINK_EXTRA_CONFIG=$'metrics.fetcher.update-interval: 1s\nrest.cache.execution-graph.timeout: 0s' $ROOT/scripts/flink-testenv.sh start --scheduler adaptive >/dev/null
printf 't_seconds,rate\n0,%s\n100000,%s\n' "${RATE:-20000}" "${RATE:-20000}" > "$TMPD/load.csv"
$ROOT/target/release/streamscale load --brokers "$BROKERS" --topic rec-in --trace "$TMPD/load.csv" --keys 1000 --duration ${LOAD_S:-300}s > "$TMPD/load.log" 2>&1 &
B=$FLINK_REST_URL
JAR_ID=$(curl -sS -X POST -F "jarfile=@$JOB_JAR" "$B/jars/upload" | python3 -c 'import sys,json; print(json.load(sys.stdin)["filename"].rsplit("/",1)[-1])')
JID=$(curl -sS -X POST -H 'Content-Type: application/json' -d "{\"entryClass\":\"streamscale.bench.KafkaWindowSum\",\"programArgsList\":[\"--brokers\",\"$BROKERS\",\"--input\",\"rec-in\",\"--output\",\"rec-out\",\"--parallelism\",\"${P:-2}\",\"--checkpoint-ms\",\"5000\",\"--transactional-id-prefix\",\"rec\",\"--group\",\"rec\"]}" "$B/jars/$JAR_ID/run" | python3 -c 'import sys,json; print(json.load(sys.stdin)["jobid"])')
echo "JID=$JID"
sleep ${WAIT_S:-40}
curl -sS "$B/jobs/$JID" | python3 -m json.tool > "$OUTD/kafka-job.json"
SRC=$(python3 -c "import json; j=json.load(open('$OUTD/kafka-job.json')); print([v['id'] for v in j['vertices'] if v['name'].startswith('Source')][0])")
curl -sS "$B/jobs/$JID/vertices/$SRC" | python3 -m json.tool > "$OUTD/kafka-vertex-source.json"
curl -sS "$B/jobs/$JID/vertices/$SRC/metrics" | python3 -m json.tool > "$OUTD/kafka-source-metric-ids.json"
O=$OUTD
SRC=$(python3 -c "import json; j=json.load(open('$O/kafka-job.json')); print([v['id'] for v in j['vertices'] if v['name'].startswith('Source')][0])")
KEY=$(python3 -c "import json; j=json.load(open('$O/kafka-job.json')); print([v['id'] for v in j['vertices'] if not v['name'].startswith('Source')][0])")
IDS="0.Source__kafka.pendingRecords,1.Source__kafka.pendingRecords,0.Source__kafka.numRecordsOut,1.Source__kafka.numRecordsOut"
for suf in "" "-later"; do
  curl -sS "$B/jobs/$JID/vertices/$SRC" | python3 -m json.tool > "$O/kafka-vertex-source$suf.json"
  curl -sS "$B/jobs/$JID/vertices/$KEY" | python3 -m json.tool > "$O/kafka-vertex-window$suf.json"
  curl -sS "$B/jobs/$JID/vertices/$SRC/metrics?get=$IDS" | python3 -m json.tool > "$O/kafka-source-metric-values$suf.json"
  [ -z "$suf" ] && sleep 10
done
curl -sS "$B/jobs/$JID" | python3 -m json.tool > "$O/kafka-job.json"
curl -sS "$B/overview" | python3 -m json.tool > "$O/kafka-overview.json"
echo "load log: $TMPD/load.log"
echo "recorded into $OUTD; job $JID, broker, cluster and load left running"
