// Flink side of scripts/bench-rescale-downtime.sh: a keyed job whose state is `keys` keys, each
// holding five longs (the shape of streamscale's window state: key + 5 x 64-bit fields).
//
// Args: KEYS PARALLELISM MARKER_DIR RATE BACKEND(hashmap|rocksdb)
// - The source (parallelism 1) first emits keys 0..KEYS-1 once (filling the state as fast as
//   the job goes), then keys drawn from 0..KEYS-1 at about RATE records/s.
// - The keyed operator (parallelism PARALLELISM, max parallelism 128) updates each key's
//   state; the first record it processes in a job is stamped (wall clock, ms since the Unix
//   epoch) into MARKER_DIR/first-<job id>, which the bench reads as "first record processed
//   after restore".
package bench;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple5;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

public class KeyedStateJob {

    /** Index -> key: fill first, then uniform keys at about `rate` records/s. */
    static final class KeyGen implements GeneratorFunction<Long, Long> {
        private final long keys;
        private final long perMs;

        KeyGen(long keys, long rate) {
            this.keys = keys;
            this.perMs = Math.max(1, rate / 1000);
        }

        @Override
        public Long map(Long index) throws Exception {
            if (index < keys) {
                return index;
            }
            if (index % perMs == 0) {
                Thread.sleep(1);
            }
            long x = index;
            x ^= x >>> 33;
            x *= 0xff51afd7ed558ccdL;
            x ^= x >>> 33;
            return Long.remainderUnsigned(x, keys);
        }
    }

    /** Per key: count, sum and three more longs (as streamscale's pane fields). */
    static final class Counts extends KeyedProcessFunction<Long, Long, Long> {
        private static final AtomicBoolean FIRST = new AtomicBoolean(true);
        private final String marker;
        private transient ValueState<Tuple5<Long, Long, Long, Long, Long>> state;

        Counts(String marker) {
            this.marker = marker;
        }

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext ctx) {
            state = getRuntimeContext().getState(new ValueStateDescriptor<>("counts",
                    Types.TUPLE(Types.LONG, Types.LONG, Types.LONG, Types.LONG, Types.LONG)));
        }

        @Override
        public void processElement(Long key, Context ctx, Collector<Long> out) throws Exception {
            Tuple5<Long, Long, Long, Long, Long> s = state.value();
            if (s == null) {
                s = Tuple5.of(0L, 0L, 0L, 0L, 0L);
            }
            s.f0 += 1;
            s.f1 += key % 100;
            s.f2 += 1;
            s.f3 += key % 100;
            s.f4 = Math.max(s.f4, key % 1000);
            state.update(s);
            if (FIRST.compareAndSet(true, false)) {
                String job = getRuntimeContext().getJobInfo().getJobId().toString();
                Files.writeString(Path.of(marker, "first-" + job),
                        Long.toString(System.currentTimeMillis()));
            }
        }
    }

    public static void main(String[] args) throws Exception {
        long keys = Long.parseLong(args[0]);
        int parallelism = Integer.parseInt(args[1]);
        String marker = args[2];
        long rate = Long.parseLong(args[3]);
        String backend = args[4];
        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, backend);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setMaxParallelism(128);
        DataGeneratorSource<Long> source = new DataGeneratorSource<>(
                new KeyGen(keys, rate), Long.MAX_VALUE, RateLimiterStrategy.noOp(), Types.LONG);
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "source")
                .uid("source").setParallelism(1)
                .keyBy(k -> k, Types.LONG)
                .process(new Counts(marker)).uid("counts").setParallelism(parallelism)
                .sinkTo(new DiscardingSink<>()).uid("sink").setParallelism(1);
        env.execute("downtime");
    }
}
