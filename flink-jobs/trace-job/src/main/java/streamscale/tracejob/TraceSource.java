package streamscale.tracejob;

import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.connector.source.ReaderOutput;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.connector.source.SourceSplit;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.core.io.InputStatus;
import org.apache.flink.core.io.SimpleVersionedSerializer;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * An unbounded FLIP-27 source whose output follows a rate schedule: a constant rate or a
 * {@code t_seconds,rate} trace, on a wall clock anchored at a fixed epoch (milliseconds).
 *
 * <p>Records are {@code (key, seq)}: {@code seq} is the record's global index in the schedule
 * (0, 1, 2, ...), {@code key} a hash of it modulo the number of keys. By wall time {@code w}
 * seconds after the epoch, {@code floor(schedule.cumulative(w))} records are due in total.
 *
 * <p>The schedule is cut into a fixed number of splits: split {@code i} of {@code n} owns the
 * records whose {@code seq % n == i}, and its state is just the number of records it emitted.
 * The enumerator hands out split {@code i} to reader {@code i % parallelism}; on a restore
 * (failover, in-place rescale, resubmission from a savepoint) Flink redistributes the readers'
 * checkpointed splits round-robin over the new readers. Each split then resumes at its
 * checkpointed count: nothing is lost or emitted twice beyond Flink's usual replay of the records
 * since the checkpoint (exactly-once for the keyed state), and records due while the job was down
 * are due at once, as a backlog (like a Kafka topic that kept filling). With more readers than
 * splits, the extra readers idle; with splits not divisible by the parallelism, readers carry
 * unequal shares of the schedule (the default 12 splits divide evenly by 1, 2, 3, 4 and 6).
 *
 * <p>The reader reports the standard {@code pendingRecords} metric: records its splits are due to
 * have emitted by now but have not (a back-pressured source's backlog).
 */
public final class TraceSource implements Source<Tuple2<Integer, Long>, TraceSource.Split, List<TraceSource.Split>> {
    private static final long serialVersionUID = 1L;

    private final Schedule schedule;
    private final long epochMs;
    private final int numSplits;
    private final int keys;
    private final boolean reportPending;
    private final int pollDelayMs;

    public TraceSource(Schedule schedule, long epochMs, int numSplits, int keys, boolean reportPending) {
        this.schedule = schedule;
        this.epochMs = epochMs;
        this.numSplits = numSplits;
        this.keys = keys;
        this.reportPending = reportPending;
        this.pollDelayMs = 2;
    }

    @Override
    public Boundedness getBoundedness() {
        return Boundedness.CONTINUOUS_UNBOUNDED;
    }

    @Override
    public SourceReader<Tuple2<Integer, Long>, Split> createReader(SourceReaderContext ctx) {
        return new Reader(this, ctx);
    }

    @Override
    public SplitEnumerator<Split, List<Split>> createEnumerator(SplitEnumeratorContext<Split> ctx) {
        List<Split> all = new ArrayList<>();
        for (int i = 0; i < numSplits; i++) all.add(new Split(i, numSplits, 0));
        return new Enumerator(ctx, all);
    }

    @Override
    public SplitEnumerator<Split, List<Split>> restoreEnumerator(SplitEnumeratorContext<Split> ctx, List<Split> unassigned) {
        return new Enumerator(ctx, unassigned);
    }

    @Override
    public SimpleVersionedSerializer<Split> getSplitSerializer() {
        return new SplitSerializer();
    }

    @Override
    public SimpleVersionedSerializer<List<Split>> getEnumeratorCheckpointSerializer() {
        return new SplitListSerializer();
    }

    // ------------------------------------------------------------------------------ schedule

    /** Records due since the epoch: a constant rate, or a trace replayed at a speed-up and scale. */
    public static final class Schedule implements Serializable {
        private static final long serialVersionUID = 1L;
        final double constantRate; // records per wall second when times == null
        final double[] times; // trace seconds, strictly increasing
        final double[] rates; // events per trace second, over [times[i], times[i+1])
        final double[] cum; // integral of the trace rate from times[0] to times[i]
        final double end; // times[last] + resolution: the last row lasts one resolution
        final double speedup, scale, start;
        final boolean repeat; // past the end: repeat the trace (true) or hold the last rate

        private Schedule(double constantRate, double[] times, double[] rates, double resolution,
                         double speedup, double scale, double start, boolean repeat) {
            this.constantRate = constantRate;
            this.times = times;
            this.rates = rates;
            this.speedup = speedup;
            this.scale = scale;
            this.start = start;
            this.repeat = repeat;
            if (times == null) {
                this.cum = null;
                this.end = 0;
            } else {
                cum = new double[times.length + 1];
                for (int i = 0; i < times.length; i++) {
                    double next = i + 1 < times.length ? times[i + 1] : times[i] + resolution;
                    cum[i + 1] = cum[i] + rates[i] * (next - times[i]);
                }
                end = times[times.length - 1] + resolution;
            }
        }

        public static Schedule constant(double rate) {
            return new Schedule(rate, null, null, 0, 1, 1, 0, false);
        }

        /**
         * A trace file in the shared format (header {@code t_seconds,rate}; a missing row holds
         * the previous rate; the last row lasts one resolution, the median step).
         */
        public static Schedule trace(Path file, double speedup, double scale, double start, boolean repeat)
                throws IOException {
            List<String> lines = Files.readAllLines(file, StandardCharsets.UTF_8);
            if (lines.isEmpty() || !lines.get(0).replace("\uFEFF", "").trim().equals("t_seconds,rate")) {
                throw new IllegalArgumentException(file + ": expected the header `t_seconds,rate`");
            }
            List<double[]> rows = new ArrayList<>();
            for (int n = 1; n < lines.size(); n++) {
                String row = lines.get(n).trim();
                if (row.isEmpty()) continue;
                String[] c = row.split(",");
                double t, r;
                try {
                    if (c.length != 2) throw new NumberFormatException();
                    t = Double.parseDouble(c[0].trim());
                    r = Double.parseDouble(c[1].trim());
                } catch (NumberFormatException e) {
                    throw new IllegalArgumentException(file + ":" + (n + 1) + ": expected `t_seconds,rate`, got `" + row + "`");
                }
                if (!(r >= 0) || Double.isInfinite(r) || Double.isNaN(t) || Double.isInfinite(t)
                        || (!rows.isEmpty() && t <= rows.get(rows.size() - 1)[0])) {
                    throw new IllegalArgumentException(file + ":" + (n + 1) + ": bad row `" + row
                            + "` (time must increase, rate must be a non-negative number)");
                }
                rows.add(new double[] {t, r});
            }
            if (rows.isEmpty()) throw new IllegalArgumentException(file + ": trace has no data rows");
            double[] times = new double[rows.size()], rates = new double[rows.size()];
            for (int i = 0; i < rows.size(); i++) {
                times[i] = rows.get(i)[0];
                rates[i] = rows.get(i)[1];
            }
            double resolution = 1;
            if (times.length > 1) {
                double[] steps = new double[times.length - 1];
                for (int i = 1; i < times.length; i++) steps[i - 1] = times[i] - times[i - 1];
                Arrays.sort(steps);
                resolution = steps[steps.length / 2];
            }
            return new Schedule(0, times, rates, resolution, speedup, scale, start, repeat);
        }

        /** Integral of the trace rate from times[0] to trace time t (events). */
        private double integral(double t) {
            if (t <= times[0]) return 0;
            if (t >= end) {
                double total = cum[times.length];
                if (!repeat) return total + rates[rates.length - 1] * (t - end);
                double period = end - times[0];
                double k = Math.floor((t - times[0]) / period);
                return k * total + integral(t - k * period);
            }
            int i = Arrays.binarySearch(times, t);
            if (i < 0) i = -i - 2;
            return cum[i] + rates[i] * (t - times[i]);
        }

        /** Records due (fractional) by wall second {@code wallS} after the epoch. */
        public double cumulative(double wallS) {
            if (wallS <= 0) return 0;
            if (times == null) return constantRate * wallS;
            return (integral(start + wallS * speedup) - integral(start)) * scale / speedup;
        }

        /** Target rate in records per wall second at wall second {@code wallS} (for logs). */
        public double rate(double wallS) {
            if (times == null) return constantRate;
            double dt = 1.0 / 1024;
            return (cumulative(wallS + dt) - cumulative(wallS)) / dt;
        }
    }

    // ------------------------------------------------------------------------------ splits

    /** Split {@code index} of {@code of}: records with {@code seq % of == index}; {@code emitted} so far. */
    public static final class Split implements SourceSplit {
        final int index, of;
        final long emitted;

        Split(int index, int of, long emitted) {
            this.index = index;
            this.of = of;
            this.emitted = emitted;
        }

        @Override
        public String splitId() {
            return "trace-" + index + "-of-" + of;
        }

        @Override
        public String toString() {
            return splitId() + "@" + emitted;
        }
    }

    /** Records of split {@code index} of {@code of} among the first {@code due} of the schedule. */
    static long dueFor(long due, int index, int of) {
        return due <= index ? 0 : (due - index + of - 1) / of;
    }

    static final class SplitSerializer implements SimpleVersionedSerializer<Split> {
        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(Split s) throws IOException {
            ByteArrayOutputStream b = new ByteArrayOutputStream();
            DataOutputStream out = new DataOutputStream(b);
            out.writeInt(s.index);
            out.writeInt(s.of);
            out.writeLong(s.emitted);
            out.flush();
            return b.toByteArray();
        }

        @Override
        public Split deserialize(int version, byte[] bytes) throws IOException {
            DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes));
            return new Split(in.readInt(), in.readInt(), in.readLong());
        }
    }

    static final class SplitListSerializer implements SimpleVersionedSerializer<List<Split>> {
        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(List<Split> splits) throws IOException {
            ByteArrayOutputStream b = new ByteArrayOutputStream();
            DataOutputStream out = new DataOutputStream(b);
            out.writeInt(splits.size());
            for (Split s : splits) {
                out.writeInt(s.index);
                out.writeInt(s.of);
                out.writeLong(s.emitted);
            }
            out.flush();
            return b.toByteArray();
        }

        @Override
        public List<Split> deserialize(int version, byte[] bytes) throws IOException {
            DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes));
            int n = in.readInt();
            List<Split> splits = new ArrayList<>(n);
            for (int i = 0; i < n; i++) splits.add(new Split(in.readInt(), in.readInt(), in.readLong()));
            return splits;
        }
    }

    // ------------------------------------------------------------------------------ enumerator

    /**
     * Pushes splits to readers as they register: a fresh split {@code i} goes to reader
     * {@code i % parallelism}, a split given back after a failure to the reader it came from.
     * Its checkpoint is the list of splits not yet assigned (empty once all readers registered).
     */
    static final class Enumerator implements SplitEnumerator<Split, List<Split>> {
        private final SplitEnumeratorContext<Split> ctx;
        private final TreeMap<Integer, Split> unassigned = new TreeMap<>();
        private final Map<Integer, Integer> owner = new HashMap<>(); // split index -> subtask

        Enumerator(SplitEnumeratorContext<Split> ctx, List<Split> unassigned) {
            this.ctx = ctx;
            for (Split s : unassigned) this.unassigned.put(s.index, s);
        }

        @Override
        public void start() {}

        @Override
        public void handleSplitRequest(int subtask, String host) {
            assignTo(subtask);
        }

        @Override
        public void addSplitsBack(List<Split> splits, int subtask) {
            for (Split s : splits) {
                unassigned.put(s.index, s);
                owner.put(s.index, subtask);
            }
            if (ctx.registeredReaders().containsKey(subtask)) assignTo(subtask);
        }

        @Override
        public void addReader(int subtask) {
            assignTo(subtask);
        }

        private void assignTo(int subtask) {
            int p = ctx.currentParallelism();
            List<Split> mine = new ArrayList<>();
            for (Split s : new ArrayList<>(unassigned.values())) {
                int to = owner.containsKey(s.index) ? owner.get(s.index) : s.index % p;
                if (to >= p) to = s.index % p;
                if (to == subtask) {
                    mine.add(s);
                    unassigned.remove(s.index);
                    owner.remove(s.index);
                }
            }
            for (Split s : mine) ctx.assignSplit(s, subtask);
        }

        @Override
        public List<Split> snapshotState(long checkpointId) {
            return new ArrayList<>(unassigned.values());
        }

        @Override
        public void close() {}
    }

    // ------------------------------------------------------------------------------ reader

    /** A split's live progress in the reader; {@code emitted} is written by the task thread only. */
    static final class Progress {
        final int index, of;
        volatile long emitted;

        Progress(Split s) {
            index = s.index;
            of = s.of;
            emitted = s.emitted;
        }
    }

    static final class Reader implements SourceReader<Tuple2<Integer, Long>, Split> {
        private static final int MAX_BATCH = 64;
        private final TraceSource src;
        private final SourceReaderContext ctx;
        private final List<Progress> splits = new CopyOnWriteArrayList<>();
        private final ScheduledExecutorService timer;
        private CompletableFuture<Void> available = CompletableFuture.completedFuture(null);
        private int next; // round-robin position over splits

        Reader(TraceSource src, SourceReaderContext ctx) {
            this.src = src;
            this.ctx = ctx;
            this.timer = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "trace-source-timer-" + ctx.getIndexOfSubtask());
                t.setDaemon(true);
                return t;
            });
        }

        private long dueNow() {
            double wallS = (System.currentTimeMillis() - src.epochMs) / 1000.0;
            return (long) Math.floor(src.schedule.cumulative(wallS));
        }

        /** Records due to this reader's splits by now but not emitted yet. */
        long pending() {
            long due = dueNow(), sum = 0;
            for (Progress p : splits) sum += Math.max(0, dueFor(due, p.index, p.of) - p.emitted);
            return sum;
        }

        @Override
        public void start() {
            if (src.reportPending) ctx.metricGroup().setPendingRecordsGauge(this::pending);
        }

        @Override
        public InputStatus pollNext(ReaderOutput<Tuple2<Integer, Long>> out) {
            int n = splits.size();
            if (n == 0) return InputStatus.NOTHING_AVAILABLE;
            long due = dueNow();
            int emitted = 0;
            for (int tried = 0; tried < n && emitted < MAX_BATCH; ) {
                Progress p = splits.get(next % n);
                if (p.emitted < dueFor(due, p.index, p.of)) {
                    long seq = p.emitted * p.of + p.index;
                    out.collect(Tuple2.of(keyOf(seq, src.keys), seq));
                    p.emitted = p.emitted + 1;
                    emitted++;
                    tried = 0;
                } else {
                    tried++;
                }
                next = (next + 1) % n;
            }
            return emitted > 0 ? InputStatus.MORE_AVAILABLE : InputStatus.NOTHING_AVAILABLE;
        }

        static int keyOf(long seq, int keys) {
            long z = seq + 0x9E3779B97F4A7C15L; // splitmix64 finalizer
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            z = z ^ (z >>> 31);
            return (int) Long.remainderUnsigned(z, keys);
        }

        @Override
        public synchronized CompletableFuture<Void> isAvailable() {
            if (available.isDone()) {
                CompletableFuture<Void> f = new CompletableFuture<>();
                available = f;
                timer.schedule(() -> f.complete(null), src.pollDelayMs, TimeUnit.MILLISECONDS);
            }
            return available;
        }

        @Override
        public List<Split> snapshotState(long checkpointId) {
            List<Split> state = new ArrayList<>(splits.size());
            for (Progress p : splits) state.add(new Split(p.index, p.of, p.emitted));
            return state;
        }

        @Override
        public void addSplits(List<Split> added) {
            for (Split s : added) splits.add(new Progress(s));
            synchronized (this) {
                available.complete(null);
            }
        }

        @Override
        public void notifyNoMoreSplits() {}

        @Override
        public void close() {
            timer.shutdownNow();
        }
    }
}
