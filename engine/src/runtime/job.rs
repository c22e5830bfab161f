//! Starting a job (wiring subtasks, channels, state and checkpoints), stopping it and collecting its final state.

use super::*;

impl Job {
    /// Starts every subtask of `spec`, restoring from `restore` when given.
    ///
    /// `restore` must already have been verified against `spec` ([`Savepoint::read`]); each
    /// keyed subtask takes the key groups it owns at its new parallelism.
    ///
    /// Each transactional sink first recovers ([`TwoPhaseCommitSink::recover`]): it commits
    /// the pre-commits `restore` lists for it and aborts every other transaction it left.
    ///
    /// # Errors
    /// [`RuntimeError`] when a trace or sink file cannot be opened or a sink cannot recover; no
    /// thread is left running.
    pub fn start(
        spec: JobSpec,
        restore: Option<&Savepoint>,
        metrics: EngineMetrics,
        options: RuntimeOptions,
    ) -> Result<Job, RuntimeError> {
        let order = spec.topological_order().map_err(RuntimeError::Graph)?;
        let control = Arc::new(Control::default());
        let k = spec.max_parallelism;
        let job_started_unix_ms = restore
            .map(|s| s.metadata.job_started_unix_ms)
            .unwrap_or_else(|| now_unix_us() / 1000);

        // Rate functions and sink files first: fail before any thread starts.
        let mut rates = BTreeMap::new();
        let mut sink_files = BTreeMap::new();
        let mut two_phase: BTreeMap<String, Arc<dyn TwoPhaseCommitSink>> = BTreeMap::new();
        // Kafka sources' partition counts, read once here. One clear error before any thread
        // starts for a Kafka source or sink whose brokers are unreachable or topic is missing.
        let mut kafka_partitions: BTreeMap<String, i32> = BTreeMap::new();
        let topic_partitions = |operator: &str,
                                servers: &str,
                                security: Option<&crate::kafka::security::KafkaSecurity>,
                                topic: &str| {
            crate::kafka::partition_count_as(servers, security, topic).map_err(|source| {
                RuntimeError::Kafka {
                    operator: operator.to_string(),
                    source: Box::new(source),
                }
            })
        };
        for op in &spec.operators {
            match &op.kind {
                OperatorKind::Source { rate, kafka, .. } => {
                    if let Some(k) = kafka {
                        let n = topic_partitions(
                            &op.name,
                            &k.bootstrap_servers,
                            k.security.as_ref(),
                            &k.topic,
                        )?;
                        kafka_partitions.insert(op.name.clone(), n);
                    }
                    rates.insert(op.name.clone(), Arc::new(RateFunction::from_spec(rate)?));
                }
                OperatorKind::Sink {
                    kafka: Some(k),
                    delivery,
                    ..
                } => {
                    topic_partitions(
                        &op.name,
                        &k.bootstrap_servers,
                        k.security.as_ref(),
                        &k.topic,
                    )?;
                    let sink: Arc<dyn TwoPhaseCommitSink> = Arc::new(
                        crate::kafka::sink::KafkaSink::new(&spec.name, &op.name, k, *delivery)
                            .with_transactional_id_scope(options.transactional_id_scope.as_deref()),
                    );
                    install_two_phase(&mut two_phase, restore, &op.name, sink)?;
                }
                OperatorKind::Sink {
                    output: Some(path),
                    delivery: SinkDelivery::ExactlyOnce,
                    ..
                } => {
                    let sink: Arc<dyn TwoPhaseCommitSink> =
                        Arc::new(FileSink::new(&op.name, path.clone()));
                    install_two_phase(&mut two_phase, restore, &op.name, sink)?;
                }
                OperatorKind::Sink {
                    output: Some(path),
                    delivery: SinkDelivery::AtLeastOnce,
                    ..
                } => {
                    // Like a file sink's base path: missing parent directories are created.
                    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
                    let file = parent
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|()| OpenOptions::new().create(true).append(true).open(path))
                        .map_err(|source| RuntimeError::SinkOutput {
                            path: path.clone(),
                            source,
                        })?;
                    sink_files.insert(op.name.clone(), file);
                }
                _ => {}
            }
        }

        // Names of the transactions (part files) this start opens: unique per start, so that
        // they never collide with an earlier attempt's.
        let attempt = next_attempt();

        // One input queue per non-source subtask that heads a chain; input channels are
        // numbered per upstream subtask (upstream operators in edge order). A chain member's
        // only input channel is its upstream member.
        let chaining = options.chaining;
        let member = |name: &str| chain::is_chained_member(&spec, name, chaining);
        let mut inputs: BTreeMap<String, Vec<Queue>> = BTreeMap::new();
        let mut channels: BTreeMap<String, usize> = BTreeMap::new();
        for op in &spec.operators {
            if matches!(op.kind, OperatorKind::Source { .. }) {
                continue;
            }
            if member(&op.name) {
                channels.insert(op.name.clone(), 1);
                continue;
            }
            let cap = spec.channel_capacity;
            inputs.insert(
                op.name.clone(),
                (0..op.parallelism)
                    .map(|_| {
                        let (tx, rx) = bounded(cap);
                        (tx, rx, Batched::default())
                    })
                    .collect(),
            );
            let n: u32 = spec
                .inputs_of(&op.name)
                .iter()
                .filter_map(|u| spec.operator(u))
                .map(|u| u.parallelism)
                .sum();
            channels.insert(op.name.clone(), n as usize);
        }
        let outputs_of = |name: &str, index: u32| -> Outputs {
            let routes = spec
                .outputs_of(name)
                .into_iter()
                .filter_map(|to| {
                    let queues = inputs.get(to)?;
                    let down = spec.operator(to)?;
                    let offset: u32 = spec
                        .inputs_of(to)
                        .iter()
                        .take_while(|u| **u != name)
                        .filter_map(|u| spec.operator(u))
                        .map(|u| u.parallelism)
                        .sum();
                    Some(Route {
                        txs: queues.iter().map(|(tx, _, _)| tx.clone()).collect(),
                        batched: queues.iter().map(|(_, _, b)| b.clone()).collect(),
                        channel: offset + index,
                        keyed: down.kind.is_keyed(),
                        key_of: key_selector(&down.kind),
                        next: index as usize,
                    })
                })
                .collect();
            Outputs {
                routes,
                max_parallelism: k,
                chain: None,
                ran_until: None,
            }
        };
        let (ack_tx, ack_rx) = crossbeam_channel::unbounded::<Ack>();
        // Job-wide channel number of each operator's first subtask (watermark senders).
        let mut channel_base = BTreeMap::new();
        let mut next_channel = 0u32;
        for op in &spec.operators {
            channel_base.insert(op.name.clone(), next_channel);
            next_channel += op.parallelism;
        }

        // Per operator: live counters, source gates, sink writers.
        let mut counters = BTreeMap::new();
        let mut gates = BTreeMap::new();
        let mut kafka_figures = BTreeMap::new();
        let mut sinks: BTreeMap<String, SinkWriter> = BTreeMap::new();
        for op in &spec.operators {
            let name = &op.name;
            let live = Arc::new(LiveCounters::default());
            let restored = restore
                .and_then(|s| s.metadata.counters.get(name).copied())
                .unwrap_or_default();
            live.records_in
                .store(restored.records_in, Ordering::Relaxed);
            live.records_out
                .store(restored.records_out, Ordering::Relaxed);
            live.accounted.store(restored.accounted, Ordering::Relaxed);
            live.filtered.store(restored.filtered, Ordering::Relaxed);
            counters.insert(name.clone(), live);
            if let OperatorKind::Source { kafka, .. } = &op.kind {
                let restored = restore.and_then(|s| s.metadata.sources.get(name));
                let gate = Arc::new(SourceGate::with_offsets(
                    restored.map_or(0, |p| p.emitted),
                    restored
                        .map(|p| p.kafka_offsets.clone())
                        .unwrap_or_default(),
                ));
                if let Some(k) = kafka {
                    let partitions = kafka_partitions.get(name).copied().unwrap_or(0);
                    kafka_figures.insert(
                        name.clone(),
                        Arc::new(KafkaFigures::new(gate.clone(), k, partitions)),
                    );
                }
                gates.insert(name.clone(), gate);
            }
            if let Some(f) = sink_files.remove(name) {
                sinks.insert(
                    name.clone(),
                    Arc::new(std::sync::Mutex::new(BufWriter::new(f))),
                );
            }
        }
        // The context of subtask `index` of operator `op` sending into `outputs`.
        let context = |op: &crate::spec::OperatorSpec,
                       index: u32,
                       outputs: Outputs,
                       chained: bool|
         -> SubtaskContext {
            let name = &op.name;
            let mut meter = Meter {
                sink: (options.metrics_enabled && matches!(op.kind, OperatorKind::Sink { .. }))
                    .then(|| {
                        let l = [name.as_str(), &index.to_string()];
                        SinkMeter {
                            latency: metrics.sink_latency.local(l),
                            accounted: metrics.sink_accounted.with_label_values(&l),
                            accounted_published: 0,
                            clock_uses: 0,
                        }
                    }),
                service: (options.metrics_enabled
                    && !matches!(op.kind, OperatorKind::Source { .. }))
                .then(|| ServiceMeter {
                    series: metrics
                        .service_time
                        .series([name.as_str(), &index.to_string()]),
                    moments: ServiceMoments::default(),
                    mark_records: 0,
                    mark_at: Instant::now(),
                    mark_clock: Duration::ZERO,
                    flushed: Duration::ZERO,
                }),
                key_groups: (options.metrics_enabled && op.kind.is_keyed()).then(|| {
                    (
                        KeyGroupLoad::new(key_group_range(index, op.parallelism, k)),
                        metrics
                            .key_group_shares
                            .series([name.as_str(), &index.to_string()]),
                    )
                }),
                ..Meter::new(
                    options.metrics_enabled,
                    options.flush_interval,
                    chained,
                    [name.clone(), index.to_string()],
                    metrics.clone(),
                    counters[name].clone(),
                )
            };
            // Every series of the subtask exists from its start, at 0, so that a scrape before
            // its first record reads "nothing yet" rather than "no such subtask".
            meter.flush(0);
            SubtaskContext {
                operator: name.clone(),
                index,
                parallelism: op.parallelism,
                max_parallelism: k,
                cpu_us: op.cpu,
                io_us: op.io,
                control: control.clone(),
                meter,
                outputs,
                acks: ack_tx.clone(),
                panic_at: options.panic_at.clone().filter(|p| p.operator == *name),
                channel: channel_base.get(name).copied().unwrap_or(0) + index,
                ended: false,
                committables: Vec::new(),
                background_failure: Default::default(),
            }
        };
        // What subtask `index` of non-source operator `op` does, with its restored state.
        let operator = |op: &crate::spec::OperatorSpec,
                        index: u32,
                        channel: u32|
         -> Result<Operator, RuntimeError> {
            let name = &op.name;
            let restored_state = || {
                let range = key_group_range(index, op.parallelism, k);
                restore
                    .and_then(|s| s.state.get(name))
                    .map(|s| s.slice(range))
                    .unwrap_or_default()
            };
            // Job-wide channel (watermark sender) of each input channel, by input index: a
            // chain member's only input is its upstream member, others are numbered per
            // upstream subtask, upstream operators in edge order (as `outputs_of` tags them).
            let base = |u: &str| channel_base.get(u).copied().unwrap_or(0);
            let ups = spec.inputs_of(name);
            let input_channels: Vec<u32> = if member(name) {
                ups.first().map(|u| base(u) + index).into_iter().collect()
            } else {
                ups.iter()
                    .filter_map(|u| spec.operator(u))
                    .flat_map(|u| (0..u.parallelism).map(move |i| (&u.name, i)))
                    .map(|(u, i)| base(u) + i)
                    .collect()
            };
            let stage =
                EventTimeStage::for_kind(&op.kind, &input_channels, channel, k, restored_state())
                    .map_err(|source| RuntimeError::State {
                    operator: name.clone(),
                    source,
                })?;
            let behaviour = match stage {
                Some(stage) => Behaviour::EventTime {
                    stage: Box::new(stage),
                    out: StageOutput::default(),
                },
                None => {
                    let owner = StateOwner {
                        job: spec.name.clone(),
                        operator: name.clone(),
                        subtask: index,
                        unloaded_gauge: Some(
                            metrics
                                .state_restored_unloaded_bytes
                                .with_label_values(&[name.as_str(), &index.to_string()]),
                        ),
                    };
                    let open = || StateBackend::open(&spec.state, &owner, k, restored_state());
                    let writer = two_phase
                        .get(name)
                        .map(|s| s.create_writer(index, op.parallelism, &attempt))
                        .transpose()
                        .map_err(|source| RuntimeError::Sink {
                            operator: name.clone(),
                            source,
                        })?;
                    Behaviour::for_kind(&op.kind, open, sinks.get(name).cloned(), writer).map_err(
                        |source| RuntimeError::Backend {
                            operator: name.clone(),
                            source,
                        },
                    )?
                }
            };
            Ok(Operator { behaviour })
        };

        let mut handles = Vec::new();
        let mut spawn_failed = None;
        let mut subtasks = 0;
        // Start downstream first so receivers are ready; order does not matter for correctness.
        for name in order.iter().rev() {
            let Some(op) = spec.operator(name) else {
                continue;
            };
            if member(name) {
                continue; // runs in the thread of its chain's head
            }
            // The chain this operator heads (itself only, when nothing is chained to it).
            let mut chain_ops = vec![op];
            while let Some(next) =
                chained_successor_of(&spec, chain_ops[chain_ops.len() - 1], chaining)
            {
                chain_ops.push(next);
            }
            for index in 0..op.parallelism {
                // Build the chain from its tail: the tail sends into channels, every other
                // member into the next member.
                let mut outputs = outputs_of(&chain_ops[chain_ops.len() - 1].name, index);
                for m in chain_ops[1..].iter().rev() {
                    let ctx = context(m, index, outputs, true);
                    let op = match operator(m, index, ctx.channel) {
                        Ok(op) => op,
                        Err(e) => {
                            control.stop.store(true, Ordering::SeqCst);
                            return Err(e);
                        }
                    };
                    outputs = Outputs {
                        routes: Vec::new(),
                        max_parallelism: k,
                        ran_until: None,
                        chain: Some(Box::new(ChainMember {
                            op,
                            ctx,
                            pending: Vec::with_capacity(CHAIN_BATCH),
                            // Untimed without metrics: full batches, as before adaptation.
                            batch: if options.metrics_enabled {
                                1
                            } else {
                                CHAIN_BATCH
                            },
                        })),
                    };
                }
                let ctx = context(op, index, outputs, false);
                let body: Box<dyn FnOnce() -> Vec<SubtaskResult> + Send> = match &op.kind {
                    OperatorKind::Source { kafka: Some(k), .. } => {
                        let source = KafkaSourceTask {
                            reader: k.strict().then(|| crate::kafka::FieldReader::new(k)),
                            lenient_value: k
                                .value_field
                                .as_deref()
                                .filter(|_| !k.strict())
                                .and_then(crate::kafka::LenientValueField::new),
                            spec: k.clone(),
                            gate: gates[name].clone(),
                            group: k
                                .group
                                .clone()
                                .unwrap_or_else(|| format!("streamscale-{}-{name}", spec.name)),
                            figures: kafka_figures[name].clone(),
                            cpu_us: op.cpu,
                            io_us: op.io,
                            payload: !kafka_payload_unused(&spec, name),
                            attached: ctx.attach_source(kafka_figures[name].clone()),
                        };
                        Box::new(move || source.run(ctx))
                    }
                    OperatorKind::Source {
                        keys,
                        count,
                        nexmark,
                        ..
                    } => {
                        let source = SourceTask {
                            nexmark: nexmark
                                .as_ref()
                                .map(|n| NexmarkGenerator::new(n, ctx.channel)),
                            rate: rates[name].clone(),
                            gate: gates[name].clone(),
                            keys: *keys,
                            limit: *count,
                            job_started_unix_ms,
                            salt: murmur_fmix64(name.len() as u64 ^ 0x5eed),
                            attached: ctx.attach_source(Arc::new(SourceFigures {
                                rate: rates[name].clone(),
                                gate: gates[name].clone(),
                                limit: count.unwrap_or(u64::MAX),
                                job_started_unix_ms,
                            })),
                        };
                        Box::new(move || source.run(ctx))
                    }
                    _ => {
                        let Some((rx, batched)) = inputs
                            .get(name)
                            .and_then(|q| q.get(index as usize))
                            .map(|(_, rx, b)| (rx.clone(), b.clone()))
                        else {
                            control.stop.store(true, Ordering::SeqCst);
                            return Err(RuntimeError::Graph(format!("no input for {name}")));
                        };
                        let op_task = match operator(op, index, ctx.channel) {
                            Ok(op) => op,
                            Err(e) => {
                                control.stop.store(true, Ordering::SeqCst);
                                return Err(e);
                            }
                        };
                        let task = OperatorTask {
                            rx,
                            batched,
                            op: op_task,
                            aligner: Aligner::new(channels.get(name).copied().unwrap_or(0)),
                        };
                        Box::new(move || task.run(ctx))
                    }
                };
                let guard_control = control.clone();
                let (op_name, label) = (name.clone(), format!("{name}-{index}"));
                let guarded =
                    move || match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                        Ok(r) => r,
                        Err(panic) => {
                            let what = panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            guard_control.failed.store(true, Ordering::SeqCst);
                            guard_control.stop.store(true, Ordering::SeqCst);
                            vec![SubtaskResult {
                                operator: op_name,
                                state: None,
                                error: Some(format!("{label} panicked: {what}")),
                            }]
                        }
                    };
                match std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(guarded)
                {
                    Ok(h) => {
                        handles.push(h);
                        subtasks += chain_ops.len();
                    }
                    Err(e) => {
                        spawn_failed = Some(e);
                        break;
                    }
                }
            }
            if spawn_failed.is_some() {
                break;
            }
        }
        // Drop the runtime's own senders so channels close when upstream subtasks exit.
        drop(inputs);
        drop(ack_tx);
        let storage = options.checkpoint_storage.clone();
        let first_id = storage.as_ref().map_or(1, |s| s.next_id()).max(
            restore
                .and_then(|s| s.metadata.checkpoint_id)
                .map_or(1, |c| c + 1),
        );
        let base_counters = spec
            .operators
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    restore
                        .and_then(|s| s.metadata.counters.get(&o.name).copied())
                        .unwrap_or_default(),
                )
            })
            .collect();
        let sink_failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let coordinator = if spawn_failed.is_none() {
            let context = JobContext {
                spec: spec.clone(),
                gates: gates.iter().map(|(n, g)| (n.clone(), g.clone())).collect(),
                subtasks,
                base_counters,
                job_started_unix_ms,
                failed: control.failed.clone(),
                metrics: metrics.clone(),
                interval: spec
                    .checkpoint
                    .as_ref()
                    .filter(|_| storage.is_some())
                    .map(|c| Duration::from_secs_f64(c.interval_seconds)),
                timeout: spec
                    .checkpoint
                    .as_ref()
                    .map_or(Duration::from_secs(60), |c| {
                        Duration::from_secs_f64(c.timeout_seconds)
                    }),
                storage,
                first_id,
                sinks: two_phase.clone(),
                sink_failures: sink_failures.clone(),
            };
            match Coordinator::start(context, ack_rx) {
                Ok(c) => Some(c),
                Err(e) => {
                    spawn_failed = Some(e);
                    None
                }
            }
        } else {
            None
        };
        let job = Job {
            spec,
            control,
            handles,
            counters,
            gates,
            job_started_unix_ms,
            coordinator,
            sink_failures,
        };
        if let Some(e) = spawn_failed {
            job.control.stop.store(true, Ordering::SeqCst);
            job.control.failed.store(true, Ordering::SeqCst);
            let _ = job.join();
            return Err(RuntimeError::Spawn(e));
        }
        Ok(job)
    }

    /// The job's spec (with the parallelism it runs at).
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Live counters per operator.
    pub fn counters(&self) -> BTreeMap<String, OperatorCounters> {
        self.counters
            .iter()
            .map(|(k, v)| (k.clone(), v.snapshot()))
            .collect()
    }

    /// When the job first started (ms since the Unix epoch; carried across restores).
    pub fn job_started_unix_ms(&self) -> u64 {
        self.job_started_unix_ms
    }

    /// Triggers a checkpoint barrier of `kind` whose snapshot is written to `target`; the
    /// outcome (location and manifest, or the reason with the file) arrives on the returned
    /// channel once every subtask acknowledged the barrier and the snapshot is written.
    /// [`BarrierKind::Stop`] makes every subtask exit after the barrier; [`Job::join`] then.
    pub fn trigger(&self, kind: BarrierKind, target: Target) -> Receiver<Outcome> {
        match &self.coordinator {
            Some(c) => c.trigger(kind, target),
            None => {
                let (tx, rx) = bounded(1);
                let _ = tx.send(Err(Failed {
                    id: None,
                    reason: "the job has no checkpoint coordinator".into(),
                    snapshot: None,
                }));
                rx
            }
        }
    }

    /// Stop-with-savepoint into `dir` (a barrier with the stop flag), as [`Job::trigger`].
    pub fn stop_with_savepoint(
        &self,
        kind: StopKind,
        dir: std::path::PathBuf,
    ) -> Receiver<Outcome> {
        self.trigger(
            BarrierKind::Stop {
                drain: kind == StopKind::Drain,
            },
            Target::Savepoint(dir),
        )
    }

    /// Stops the sources at once without a snapshot (on failure or shutdown); operators exit
    /// as their inputs close.
    pub fn cancel(&self) {
        self.control.stop.store(true, Ordering::SeqCst);
    }

    /// Whether every subtask thread has returned.
    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    /// Whether a subtask failed.
    pub fn has_failed(&self) -> bool {
        self.control.failed.load(Ordering::SeqCst)
    }

    /// Waits for every subtask and assembles the final savepoint contents (not yet written).
    pub fn join(mut self) -> Finished {
        if let Some(mut c) = self.coordinator.take() {
            c.shutdown();
        }
        let mut state: BTreeMap<String, KeyedState> = BTreeMap::new();
        let mut errors = Vec::new();
        for h in self.handles {
            match h.join() {
                Ok(results) => {
                    for r in results {
                        if let Some(e) = r.error {
                            errors.push(e);
                        }
                        if let Some(s) = r.state {
                            state.entry(r.operator).or_default().merge(s);
                        }
                    }
                }
                Err(_) => errors.push("a subtask thread panicked".into()),
            }
        }
        errors.append(&mut self.sink_failures.lock().unwrap_or_else(|p| p.into_inner()));
        for op in self.spec.operators.iter().filter(|o| o.kind.is_keyed()) {
            state.entry(op.name.clone()).or_default();
        }
        let counters = self
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), v.snapshot()))
            .collect();
        let sources = self
            .gates
            .iter()
            .map(|(k, g)| {
                (
                    k.clone(),
                    SourcePosition {
                        emitted: g.emitted(),
                        kafka_offsets: g.offsets(),
                    },
                )
            })
            .collect();
        let metadata = SavepointMetadata {
            format_version: crate::savepoint::FORMAT_VERSION,
            job_name: self.spec.name.clone(),
            fingerprint: self.spec.fingerprint(),
            max_parallelism: self.spec.max_parallelism,
            parallelism: self.spec.parallelism(),
            job_started_unix_ms: self.job_started_unix_ms,
            created_unix_ms: now_unix_us() / 1000,
            sources,
            counters,
            files: Vec::new(),
            checkpoint_id: None,
            key_groups: BTreeMap::new(),
            sinks: BTreeMap::new(),
            manifest_crc32: None,
        };
        Finished {
            savepoint: Savepoint { metadata, state },
            errors,
        }
    }
}

/// A name unique to one start of a job in this process and across restarts: the start's time
/// (ms since the Unix epoch) and a counter within the process.
/// Recovers two-phase sink `name` from what the restored snapshot lists for it (commit or
/// abort, before any thread starts) and adds it to `sinks`.
fn install_two_phase(
    sinks: &mut BTreeMap<String, Arc<dyn TwoPhaseCommitSink>>,
    restore: Option<&Savepoint>,
    name: &str,
    sink: Arc<dyn TwoPhaseCommitSink>,
) -> Result<(), RuntimeError> {
    let restored = restore
        .and_then(|s| s.metadata.sinks.get(name))
        .map_or(&[][..], Vec::as_slice);
    sink.recover(restored)
        .map_err(|source| RuntimeError::Sink {
            operator: name.to_string(),
            source,
        })?;
    sinks.insert(name.to_string(), sink);
    Ok(())
}

fn next_attempt() -> String {
    static STARTS: AtomicU64 = AtomicU64::new(0);
    let n = STARTS.fetch_add(1, Ordering::Relaxed);
    format!("{}{n:03}", now_unix_us() / 1000)
}

/// Whether no operator reads the Kafka records themselves ([`Payload::Kafka`]) of source
/// `name`: it feeds only processing-time `window`s, which keep the records' keys, values and
/// counts.
fn kafka_payload_unused(spec: &JobSpec, name: &str) -> bool {
    let mut to = spec
        .edges
        .iter()
        .filter(|e| e.from == name)
        .map(|e| spec.operator(&e.to).map(|o| &o.kind))
        .peekable();
    to.peek().is_some() && to.all(|k| matches!(k, Some(OperatorKind::Window { .. })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(downstream: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            r#"name: j
operators:
  - {{ name: s, kind: source, kafka: {{ topic: t, bootstrapServers: "127.0.0.1:9092" }} }}
{downstream}
"#
        ))
        .expect("valid spec")
    }

    #[test]
    fn kafka_records_are_dropped_only_before_processing_time_windows() {
        let win = "  - { name: w, kind: window, sizeMs: 1000 }\n  - { name: o, kind: sink }";
        let edges = "edges:\n  - { from: s, to: w }\n  - { from: w, to: o }";
        assert!(kafka_payload_unused(&job(&format!("{win}\n{edges}")), "s"));
        // A filter reads the value; a sink writes the record; both keep it.
        let filter = "  - { name: f, kind: filter, where: \"n > 1\" }\n  - { name: o, kind: sink }\nedges:\n  - { from: s, to: f }\n  - { from: f, to: o }";
        assert!(!kafka_payload_unused(&job(filter), "s"));
        let sink = "  - { name: o, kind: sink }\nedges:\n  - { from: s, to: o }";
        assert!(!kafka_payload_unused(&job(sink), "s"));
        // A window and a sink side by side: the sink needs it.
        let both =
            format!("{win}\n  - {{ name: o2, kind: sink }}\n{edges}\n  - {{ from: s, to: o2 }}");
        assert!(!kafka_payload_unused(&job(&both), "s"));
        // No operator downstream at all: nothing to decide on, the record is kept.
        assert!(!kafka_payload_unused(&job(&format!("{win}\n{edges}")), "o"));
    }
}
