package streamscale.bench;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.serialization.AbstractDeserializationSchema;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.windowing.assigners.TumblingProcessingTimeWindows;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * The Flink side of bench/kafka-flink: the same computation as the streamscale engine's job in
 * bench/kafka-flink/run.sh. Kafka topic of JSON values {"seq","key","value","ts"} (from
 * `streamscale load`), read from the earliest offset; keyed by the JSON field `key`; per key,
 * the count and sum of the integer field `value` in 1-second tumbling processing-time windows;
 * written as {"key": K, "count": C, "sum": S} (Kafka key K) to a topic by an EXACTLY_ONCE
 * KafkaSink (transactional id prefix given), checkpoints every --checkpoint-ms.
 *
 * <p>Arguments: --brokers HOST:PORT --input TOPIC --output TOPIC --parallelism P
 * --checkpoint-ms MS --transactional-id-prefix PREFIX --group GROUP. A value that is not a JSON
 * object with a string `key` and an integer `value` is dropped (the engine counts it as a dead
 * letter).
 */
public final class KafkaWindowSum {
  private KafkaWindowSum() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> a = parseArgs(args);
    String brokers = need(a, "brokers");
    int parallelism = Integer.parseInt(a.getOrDefault("parallelism", "1"));
    long checkpointMs = Long.parseLong(a.getOrDefault("checkpoint-ms", "1000"));

    StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
    env.setParallelism(parallelism);
    env.enableCheckpointing(checkpointMs); // exactly-once checkpoints (the default mode)

    KafkaSource<Tuple2<String, Long>> source =
        KafkaSource.<Tuple2<String, Long>>builder()
            .setBootstrapServers(brokers)
            .setTopics(need(a, "input"))
            .setGroupId(a.getOrDefault("group", "flink-bench"))
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setValueOnlyDeserializer(new KeyValueJson())
            .build();

    KafkaSink<Tuple3<String, Long, Long>> sink =
        KafkaSink.<Tuple3<String, Long, Long>>builder()
            .setBootstrapServers(brokers)
            .setRecordSerializer(new ResultJson(need(a, "output")))
            .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
            .setTransactionalIdPrefix(need(a, "transactional-id-prefix"))
            // The broker's transaction.max.timeout.ms is 15 min; Flink's default (1 h) is refused.
            .setProperty("transaction.timeout.ms", "600000")
            .build();

    env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka")
        .uid("kafka-source")
        .keyBy(new ByKey())
        .window(TumblingProcessingTimeWindows.of(Duration.ofSeconds(1)))
        .aggregate(new CountSum())
        .uid("window-sum")
        .sinkTo(sink)
        .uid("kafka-sink");
    env.execute("kafka-window-sum");
  }

  private static Map<String, String> parseArgs(String[] args) {
    Map<String, String> m = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      if (!args[i].startsWith("--") || i + 1 >= args.length) {
        throw new IllegalArgumentException("expected --name value pairs, got: " + args[i]);
      }
      m.put(args[i].substring(2), args[++i]);
    }
    return m;
  }

  private static String need(Map<String, String> a, String k) {
    String v = a.get(k);
    if (v == null) {
      throw new IllegalArgumentException("missing --" + k);
    }
    return v;
  }

  /** A JSON value's string field `key` and integer field `value`; null (dropped) otherwise. */
  static final class KeyValueJson extends AbstractDeserializationSchema<Tuple2<String, Long>> {
    private static final long serialVersionUID = 1L;
    private transient ObjectMapper mapper;

    @Override
    public Tuple2<String, Long> deserialize(byte[] message) {
      if (mapper == null) {
        mapper = new ObjectMapper();
      }
      try {
        JsonNode n = mapper.readTree(message);
        JsonNode k = n.get("key");
        JsonNode v = n.get("value");
        if (k == null || !k.isTextual() || v == null || !v.isNumber()) {
          return null;
        }
        return Tuple2.of(k.asText(), v.asLong());
      } catch (Exception e) {
        return null;
      }
    }
  }

  static final class ByKey implements KeySelector<Tuple2<String, Long>, String> {
    private static final long serialVersionUID = 1L;

    @Override
    public String getKey(Tuple2<String, Long> t) {
      return t.f0;
    }
  }

  /** Per key and window: (key, count, sum of values). */
  static final class CountSum
      implements AggregateFunction<
          Tuple2<String, Long>, Tuple3<String, Long, Long>, Tuple3<String, Long, Long>> {
    private static final long serialVersionUID = 1L;

    @Override
    public Tuple3<String, Long, Long> createAccumulator() {
      return Tuple3.of(null, 0L, 0L);
    }

    @Override
    public Tuple3<String, Long, Long> add(Tuple2<String, Long> in, Tuple3<String, Long, Long> acc) {
      acc.f0 = in.f0;
      acc.f1 = acc.f1 + 1;
      acc.f2 = acc.f2 + in.f1;
      return acc;
    }

    @Override
    public Tuple3<String, Long, Long> getResult(Tuple3<String, Long, Long> acc) {
      return acc;
    }

    @Override
    public Tuple3<String, Long, Long> merge(
        Tuple3<String, Long, Long> x, Tuple3<String, Long, Long> y) {
      return Tuple3.of(x.f0 != null ? x.f0 : y.f0, x.f1 + y.f1, x.f2 + y.f2);
    }
  }

  /** {"key": K, "count": C, "sum": S} with Kafka key K. */
  static final class ResultJson implements KafkaRecordSerializationSchema<Tuple3<String, Long, Long>> {
    private static final long serialVersionUID = 1L;
    private final String topic;

    ResultJson(String topic) {
      this.topic = topic;
    }

    @Override
    public ProducerRecord<byte[], byte[]> serialize(
        Tuple3<String, Long, Long> r, KafkaSinkContext context, Long timestamp) {
      // Keys come from `streamscale load` (k<digits>): no JSON escaping needed for them.
      String json = "{\"key\":\"" + r.f0 + "\",\"count\":" + r.f1 + ",\"sum\":" + r.f2 + "}";
      return new ProducerRecord<>(
          topic,
          r.f0.getBytes(StandardCharsets.UTF_8),
          json.getBytes(StandardCharsets.UTF_8));
    }
  }
}
