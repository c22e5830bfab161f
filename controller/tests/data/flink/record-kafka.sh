#!/usr/bin/env bash
# Records the kafka-*.json answers of README.md: a Kafka broker (scripts/kafka-testenv.sh) and a
# Flink cluster (scripts/flink-testenv.sh, adaptive scheduler, 1 s metric refresh) on loopback,
# bench/kafka-flink's KafkaWindowSum job (built with its Kafka connector by scripts/flink-testenv.sh
# install) at parallelism 2 reading a 3-partition topic that `streamscale load` fills at 20,000
# records/s; after 40 s the job, its vertices twice 10 s apart and the source's metrics. Needs
# the release build (target/release/streamscale). Leaves the cluster, broker and load running:
# stop them with scripts/flink-testenv.sh stop, scripts/kafka-testenv.sh stop.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
OUTD=${OUTD:-$(cd "$(dirname "$0")" && pwd)}
mkdir -p "$OUTD"
TMPD=$(mktemp -d)
$ROOT/scripts/flink-testenv.sh install >/dev/null
eval "$($ROOT/scripts/flink-testenv.sh env)"
JOB_JAR=$FLINK_KAFKA_JOB_JAR
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
