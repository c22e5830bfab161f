package streamscale.tracejob;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.client.deployment.StandaloneClusterId;
import org.apache.flink.client.program.rest.RestClusterClient;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.GlobalConfiguration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.JobVertex;
import org.apache.flink.runtime.jobgraph.SavepointRestoreSettings;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.DataStreamSink;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.graph.StreamGraph;
import org.apache.flink.util.Collector;
import org.apache.flink.util.ParameterTool;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.URI;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * streamscale's demo job for a real Flink cluster:
 *
 * <pre>
 *   Source: trace  --HASH(key)-->  count -> discard: Writer
 * </pre>
 *
 * <ul>
 *   <li>{@code Source: trace} (uid {@code trace-source}): {@link TraceSource}, records due by a
 *       constant rate or a trace, reporting {@code pendingRecords}.</li>
 *   <li>{@code count} (uid {@code count}): per-key count in ValueState, {@code --cost-us} of busy
 *       time per record, emits {@code (key, count)}; gauge {@code maxKeyCount} = the largest count it
 *       emitted since this subtask started (after a restore it reaches the pre-restore counts at
 *       once when the state survived, and starts near 0 when it did not).</li>
 *   <li>{@code discard} (uid {@code discard}): a discarding sink chained to {@code count}.</li>
 * </ul>
 *
 * <p>Run with {@code --help} for the arguments. Every effective argument (including the resolved
 * {@code epoch-ms}) is stored as a global job parameter: {@code GET /jobs/<jid>/config} lists them
 * under {@code execution-config.user-config}.
 */
public final class TraceJob {
    static final String USAGE = String.join("\n",
            "streamscale trace job. Arguments (defaults in brackets):",
            "  --rate R            constant rate, records/s [4000] (ignored with --trace)",
            "  --trace FILE        t_seconds,rate CSV read at submission (the file must be readable by the",
            "                      submitting process; it is shipped inside the job)",
            "  --speedup K         trace seconds per wall second [1]",
            "  --scale S           factor on every trace rate [1]",
            "  --trace-start T     trace second at the epoch [0]",
            "  --after-end M       past the end of the trace: repeat | hold (the last rate) [repeat]",
            "  --epoch-ms E        wall-clock ms at which the schedule starts [now]; pass the same value",
            "                      when resubmitting from a savepoint so that the schedule continues",
            "  --keys N            distinct keys [1000]",
            "  --cost-us C         busy microseconds per record in the keyed operator [300]",
            "  --burn wall|cpu     wall: spin until C us of wall time passed (a fixed service time, also",
            "                      when the CPU is shared); cpu: until the thread used C us of CPU time",
            "                      (records take longer when subtasks share a core) [wall]",
            "  --splits N          source splits (the source's max useful parallelism) [12]",
            "  --no-pending        do not report the source's pendingRecords metric",
            "  --parallelism P     default parallelism of all operators [cluster's parallelism.default]",
            "  --source-parallelism P, --keyed-parallelism P   per operator (win over --parallelism)",
            "  --max-parallelism M key groups of the keyed state [128]",
            "  --name NAME         job name [trace-job]",
            "Resubmission with per-vertex parallelism (pipeline.jobvertex-parallelism-overrides VID:P,...",
            "from the job configuration, or --overrides VID:P,...) is applied by the job itself, see",
            "scripts/flink-testenv.sh. --jobgraph submits a client-compiled JobGraph instead (with",
            "--restore SP, --overrides ..., --rest URL), --print-plan prints vertex ids and exits,",
            "--ignore-overrides leaves the overrides to Flink (to check Flink's own handling).");

    public static final String SOURCE_UID = "trace-source";
    public static final String KEYED_UID = "count";
    public static final String SINK_UID = "discard";

    public static void main(String[] argv) throws Exception {
        for (String a : argv) {
            if (a.equals("--help") || a.equals("-h")) {
                System.out.println(USAGE);
                return;
            }
        }
        ParameterTool args = ParameterTool.fromArgs(argv);
        Map<String, String> effective = new LinkedHashMap<>();

        long epochMs = args.getLong("epoch-ms", System.currentTimeMillis());
        effective.put("epoch-ms", Long.toString(epochMs));
        TraceSource.Schedule schedule;
        if (args.has("trace")) {
            String after = args.get("after-end", "repeat");
            if (!after.equals("repeat") && !after.equals("hold")) {
                throw new IllegalArgumentException("--after-end must be repeat or hold, not " + after);
            }
            double speedup = args.getDouble("speedup", 1), scale = args.getDouble("scale", 1);
            if (!(speedup > 0) || !(scale > 0)) throw new IllegalArgumentException("--speedup and --scale must be > 0");
            schedule = TraceSource.Schedule.trace(Paths.get(args.get("trace")), speedup, scale,
                    args.getDouble("trace-start", 0), after.equals("repeat"));
            effective.put("trace", args.get("trace"));
            effective.put("speedup", Double.toString(speedup));
            effective.put("scale", Double.toString(scale));
            effective.put("trace-start", Double.toString(args.getDouble("trace-start", 0)));
            effective.put("after-end", after);
        } else {
            double rate = args.getDouble("rate", 4000);
            if (!(rate >= 0)) throw new IllegalArgumentException("--rate must be >= 0");
            schedule = TraceSource.Schedule.constant(rate);
            effective.put("rate", Double.toString(rate));
        }
        int keys = args.getInt("keys", 1000);
        int splits = args.getInt("splits", 12);
        long costUs = args.getLong("cost-us", 300);
        boolean pending = !args.has("no-pending");
        String burn = args.get("burn", "wall");
        if (!burn.equals("wall") && !burn.equals("cpu")) throw new IllegalArgumentException("--burn must be wall or cpu");
        if (keys < 1 || splits < 1 || costUs < 0) throw new IllegalArgumentException("--keys/--splits >= 1, --cost-us >= 0");
        effective.put("keys", Integer.toString(keys));
        effective.put("cost-us", Long.toString(costUs));
        effective.put("burn", burn);
        effective.put("splits", Integer.toString(splits));
        effective.put("pending-records", Boolean.toString(pending));

        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        int maxParallelism = args.getInt("max-parallelism", 128);
        env.setMaxParallelism(maxParallelism);
        if (args.has("parallelism")) env.setParallelism(args.getInt("parallelism"));

        DataStream<Tuple2<Integer, Long>> records = env
                .fromSource(new TraceSource(schedule, epochMs, splits, keys, pending),
                        WatermarkStrategy.noWatermarks(), "trace",
                        Types.TUPLE(Types.INT, Types.LONG))
                .uid(SOURCE_UID);
        SingleOutputStreamOperator<Tuple2<Integer, Long>> source = (SingleOutputStreamOperator<Tuple2<Integer, Long>>) records;
        SingleOutputStreamOperator<Tuple2<Integer, Long>> counted = records
                .keyBy(new ByKey(), Types.INT)
                .process(new CountAndBurn(costUs, burn.equals("cpu")), Types.TUPLE(Types.INT, Types.LONG))
                .uid(KEYED_UID)
                .name("count");
        DataStreamSink<Tuple2<Integer, Long>> sink = counted.sinkTo(new DiscardingSink<>()).uid(SINK_UID).name("discard");
        if (args.has("source-parallelism")) source.setParallelism(args.getInt("source-parallelism"));
        if (args.has("keyed-parallelism")) {
            counted.setParallelism(args.getInt("keyed-parallelism"));
            sink.setParallelism(args.getInt("keyed-parallelism")); // stays chained to count
        }

        String name = args.get("name", "trace-job");
        effective.put("name", name);
        env.getConfig().setGlobalJobParameters(ParameterTool.fromMap(effective));

        // The job's configuration: the cluster's config file and -D options (CLI) or the
        // "flinkConfiguration" of POST /jars/<id>/run, as the environment saw them.
        Configuration conf = new Configuration();
        if (args.has("jobgraph") || args.has("print-plan")) conf.addAll(GlobalConfiguration.loadConfiguration());
        conf.addAll(Configuration.fromMap(env.getConfiguration().toMap()));
        Map<String, String> overrides = new HashMap<>(conf.get(PipelineOptions.PARALLELISM_OVERRIDES));
        if (args.has("overrides")) overrides.putAll(parseOverrides(args.get("overrides")));
        if (args.has("restore")) conf.set(StateRecoveryOptions.SAVEPOINT_PATH, args.get("restore"));

        // Vertex ids come from the operator uids; the plan's parallelism does not change them.
        StreamGraph probe = env.getStreamGraph(false);
        Map<String, String> vertexOf = new HashMap<>(); // "source"/"keyed" -> vertex id
        for (JobVertex v : probe.getJobGraph(Thread.currentThread().getContextClassLoader(), JobID.generate()).getVertices()) {
            vertexOf.put(v.getName().startsWith("Source: trace") ? "source" : "keyed", v.getID().toHexString());
        }
        System.out.println("trace-job: vertices source=" + vertexOf.get("source") + " keyed=" + vertexOf.get("keyed")
                + " epoch-ms=" + epochMs + " rate-now=" + String.format("%.1f", schedule.rate((System.currentTimeMillis() - epochMs) / 1000.0)));
        if (args.has("print-plan")) return;

        // pipeline.jobvertex-parallelism-overrides is ignored by Flink 2.0-2.3 for the usual
        // (StreamGraph) submissions (FLINK-38770): apply it to our own operators here.
        if (args.has("ignore-overrides")) overrides.clear();
        for (Map.Entry<String, String> e : overrides.entrySet()) {
            int p = Integer.parseInt(e.getValue().trim());
            String vid = e.getKey().trim();
            if (vid.equals(vertexOf.get("source"))) source.setParallelism(p);
            else if (vid.equals(vertexOf.get("keyed"))) {
                counted.setParallelism(p);
                sink.setParallelism(p);
            }
            else System.out.println("trace-job: override for unknown vertex " + vid + " ignored");
        }
        if (!overrides.isEmpty()) System.out.println("trace-job: applied parallelism overrides " + overrides);

        if (!args.has("jobgraph")) {
            env.execute(name);
            return;
        }

        // --jobgraph: compile the JobGraph here and submit it over REST (like `flink run` did
        // before 2.0); the dispatcher then also honours the overrides itself.
        StreamGraph sg = env.getStreamGraph();
        sg.setJobName(name);
        sg.setSavepointRestoreSettings(SavepointRestoreSettings.fromConfiguration(conf));
        JobGraph jg = sg.getJobGraph(Thread.currentThread().getContextClassLoader(), JobID.generate());
        if (!overrides.isEmpty()) jg.getJobConfiguration().set(PipelineOptions.PARALLELISM_OVERRIDES, overrides);
        // The cluster needs this jar for the job's classes: the client uploads the graph's jars.
        List<String> jars = conf.getOptional(PipelineOptions.JARS).orElse(List.of());
        if (jars.isEmpty()) jars = List.of(TraceJob.class.getProtectionDomain().getCodeSource().getLocation().toString());
        for (String jar : jars) jg.addJar(new org.apache.flink.core.fs.Path(jar));
        if (args.has("rest")) {
            URI u = URI.create(args.get("rest"));
            conf.set(RestOptions.ADDRESS, u.getHost());
            conf.set(RestOptions.PORT, u.getPort());
        }
        try (RestClusterClient<StandaloneClusterId> client = new RestClusterClient<>(conf, StandaloneClusterId.getInstance())) {
            JobID id = client.submitJob(jg).get();
            System.out.println("Job has been submitted with JobID " + id);
        }
    }

    static Map<String, String> parseOverrides(String s) {
        Map<String, String> m = new HashMap<>();
        for (String kv : s.split(",")) {
            if (kv.isBlank()) continue;
            String[] p = kv.split(":");
            if (p.length != 2) throw new IllegalArgumentException("--overrides wants VID:P,VID:P, got " + s);
            m.put(p[0].trim(), p[1].trim());
        }
        return m;
    }

    static final class ByKey implements KeySelector<Tuple2<Integer, Long>, Integer> {
        @Override
        public Integer getKey(Tuple2<Integer, Long> r) {
            return r.f0;
        }
    }

    /** Counts records per key (ValueState) and burns {@code costUs} of CPU per record. */
    static final class CountAndBurn extends KeyedProcessFunction<Integer, Tuple2<Integer, Long>, Tuple2<Integer, Long>> {
        private final long costNs;
        private final boolean cpuClock;
        private transient ThreadMXBean threads;
        private transient ValueState<Long> count;
        private transient volatile long maxCount;
        private transient long sink; // keeps the busy loop from being optimized away

        CountAndBurn(long costUs, boolean cpuClock) {
            this.costNs = costUs * 1000;
            this.cpuClock = cpuClock;
        }

        @Override
        public void open(OpenContext ctx) {
            threads = ManagementFactory.getThreadMXBean();
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
            getRuntimeContext().getMetricGroup().gauge("maxKeyCount", (Gauge<Long>) () -> maxCount);
        }

        @Override
        public void processElement(Tuple2<Integer, Long> r, Context ctx, Collector<Tuple2<Integer, Long>> out) throws Exception {
            if (costNs > 0) {
                long x = sink;
                if (cpuClock) {
                    long t0 = threads.getCurrentThreadCpuTime();
                    do {
                        for (int i = 0; i < 256; i++) x = x * 6364136223846793005L + 1442695040888963407L;
                    } while (threads.getCurrentThreadCpuTime() - t0 < costNs);
                } else {
                    long t0 = System.nanoTime();
                    while (System.nanoTime() - t0 < costNs) x = x * 6364136223846793005L + 1442695040888963407L;
                }
                sink = x;
            }
            Long c = count.value();
            long n = (c == null ? 0 : c) + 1;
            count.update(n);
            if (n > maxCount) maxCount = n;
            out.collect(Tuple2.of(r.f0, n));
        }
    }
}
