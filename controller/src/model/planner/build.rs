//! A [`Model`] made from a job graph and a metric window: the estimates, the sources' target
//! rates (with and without the rescale's downtime backlog), the traffic equations, the keyed
//! operators' key-group loads and the window bursts each operator receives.

use super::*;

impl Model {
    /// [`Model::new`] for a graph built from `spec` (or from a spec it
    /// [matches](JobGraph::matches)), with the sources' arrivals read through `arrival_scale`
    /// (see [`estimate_indexed`]: the model of the window
    /// [`scale_arrivals`](super::forecast::scale_arrivals) would return, without the copy).
    pub(crate) fn with_graph(
        graph: Arc<JobGraph>,
        spec: &JobSpec,
        window: &[MetricSample],
        arrival_scale: Option<f64>,
        settings: &PlannerSettings,
    ) -> Result<Model, ModelError> {
        let s = settings.resolve(&spec.autoscaler)?;
        let topo = &graph.topo;
        let ModelBuffers {
            mut kg_loads,
            mut kg_prefixes,
            mut share_memo,
            mut tail_memo,
            mut figures,
        } = graph.buffers.take();
        let (elapsed, est) = estimate_flat(topo, window, arrival_scale, &mut figures)?;
        let n = topo.len();
        let mut spec_parallelism = vec![1; n];
        if graph.spec_order.len() == spec.operators.len() {
            // The graph matches the spec: its operators by position, without name lookups.
            for (op, &i) in spec.operators.iter().zip(&graph.spec_order) {
                if let Some(i) = i {
                    spec_parallelism[i] = op.parallelism;
                }
            }
        } else {
            for op in &spec.operators {
                if let Some(&i) = topo.index.get(&op.name) {
                    spec_parallelism[i] = op.parallelism;
                }
            }
        }
        let gamma: Vec<f64> = est
            .iter()
            .map(|e| e.source.map_or(0.0, |x| x.arrival_rate))
            .collect();
        // The backlog now, plus the backlog the rescale itself creates (its downtime times the
        // arrival rate), drains within the catch-up time.
        let gamma_target: Vec<f64> = est
            .iter()
            .map(|e| {
                e.source.map_or(0.0, |x| {
                    x.arrival_rate + (x.backlog_records + x.arrival_rate * s.downtime) / s.catch_up
                })
            })
            .collect();
        let key_groups = graph.key_groups;
        // Keyed operators' key-group loads, their prefix sums and the share memo, each in one
        // flat array by slot (see `kg_slot`).
        let kl = key_groups.max(1) as usize;
        let keyed = (0..n)
            .filter(|&i| topo.queue[i] == QueueKind::Keyed)
            .count();
        let mut kg_slot = Vec::with_capacity(n);
        kg_loads.clear();
        kg_loads.reserve(keyed * kl);
        kg_prefixes.clear();
        kg_prefixes.reserve(keyed * (kl + 1));
        // How each operator's output follows its input (a burst window's over its period, a
        // trickle's as a fixed rate, see `OutputModel`): the edge gains, the fixed rates
        // injected into the downstream operators, and the operators whose rate is unknown.
        let outputs: Vec<OutputModel> = (0..n)
            .map(|i| output_model(&est[i], graph.window[i], &topo.names[i], window, elapsed))
            .collect();
        let flow = Flow::of(topo, &outputs);
        let gain = &flow.gain;
        // A feedback loop whose gain is 1 or more has no finite rates: rejected, naming it.
        let lambda_target = topo.try_traffic(&flow.injected(&gamma_target), gain)?;
        let lambda_steady = topo.traffic(&flow.injected(&gamma), gain);
        let gamma_target_hold: Vec<f64> = est
            .iter()
            .map(|e| {
                e.source
                    .map_or(0.0, |x| x.arrival_rate + x.backlog_records / s.catch_up)
            })
            .collect();
        let lambda_target_hold = if s.downtime > 0.0 {
            topo.traffic(&flow.injected(&gamma_target_hold), gain)
        } else {
            lambda_target.clone()
        };
        let mut hot_run = Vec::with_capacity(n);
        let mut hottest = Vec::with_capacity(n);
        let mut hot_held = vec![false; n];
        let mut slots = 0;
        let mut offered = Vec::new();
        // One row per keyed operator (each takes the next slot).
        share_memo.reset(keyed * (key_groups as usize + 1));
        for (i, (e, queue)) in est.iter().zip(&topo.queue).enumerate() {
            if *queue != QueueKind::Keyed {
                kg_slot.push(None);
                hot_run.push((0, 0));
                hottest.push(0.0);
                continue;
            }
            let start = kg_loads.len();
            // The smaller target (without the rescale's downtime) as the denominator: either
            // target times the corrected share is at least what a saturated subtask processed.
            let rates = Rates {
                target: lambda_target_hold[i].min(lambda_target[i]),
                steady: lambda_steady[i],
                scale: arrival_scale.unwrap_or(1.0),
            };
            let listed = figures.lists(i, false);
            let shares = if offered_shares(
                e.input_rate,
                figures.input_shares(i),
                figures.saturation(i),
                !listed.is_empty(),
                rates,
                &mut offered,
            ) {
                &offered[..]
            } else {
                figures.input_shares(i)
            };
            // Held as a hot-key bottleneck (its hottest group already has a subtask to itself):
            // judged on the point readings; else on the lower bounds, which claim a hot key
            // only when the counts leave no doubt.
            let isolated = isolated_groups(figures.lists(i, true), key_groups);
            let mut run_top = None;
            if !isolated.is_empty() {
                key_group_load_into(
                    shares,
                    figures.hottest(i),
                    &figures.lists(i, true),
                    key_groups,
                    &mut kg_loads,
                );
                let (run, top) = hottest_run(&kg_loads[start..]);
                if top > 0.0 && isolated.contains(&run.0) {
                    hot_held[i] = true;
                    run_top = Some((run, top));
                } else {
                    kg_loads.truncate(start);
                }
            }
            let (run, top) = match run_top {
                Some(x) => x,
                None => {
                    key_group_load_into(
                        shares,
                        figures.hottest(i),
                        &listed,
                        key_groups,
                        &mut kg_loads,
                    );
                    hottest_run(&kg_loads[start..])
                }
            };
            let load = &kg_loads[start..];
            let mut acc = 0.0;
            // The busiest subtask's share at one key group per subtask (q = K), made on the
            // way as `busiest_range_load` makes it from these prefix sums (the largest
            // difference of neighbours, kept when larger): the same value, for the sizing
            // at the maximum parallelism, without another pass.
            let mut single = 0.0;
            kg_prefixes.push(0.0);
            // (Extended from the slice's exact-length iterator: no capacity check per entry.)
            kg_prefixes.extend(load.iter().map(|x| {
                let next = acc + x;
                let d = next - acc;
                if d > single {
                    single = d;
                }
                acc = next;
                next
            }));
            if key_groups > 0 {
                let k = key_groups as usize;
                share_memo.set(slots * (k + 1) + k, single);
            }
            hot_run.push(run);
            hottest.push(top);
            kg_slot.push(Some(slots));
            slots += 1;
        }
        // Window bursts: a bursty windowed operator's output reaches each downstream operator
        // as one batch of (output rate × period) records at every window boundary.
        let mut lambda_smooth = lambda_steady.clone();
        let mut burst_in = vec![0.0; n];
        for (i, &lambda) in lambda_steady.iter().enumerate() {
            if let Some((period, true)) = graph.window[i] {
                let out = flow.out_rate(i, lambda);
                for &j in &topo.outputs[i] {
                    lambda_smooth[j] = (lambda_smooth[j] - out).max(0.0);
                    burst_in[j] += out * period;
                }
            }
        }
        let eps = (1.0 - s.percentile) / f64::from(graph.depth);
        tail_memo.reset(graph.tail_at[n]);
        let wait = watermark_waits(topo, spec, &gamma);
        Ok(Model {
            budget: TailBudget::new(eps),
            lambda_smooth,
            burst_in,
            wait,
            graph,
            est,
            figures,
            s,
            gamma,
            gamma_target,
            lambda_target,
            gamma_target_hold,
            lambda_target_hold,
            with_downtime: true,
            lambda_steady,
            spec_parallelism,
            kg_slot,
            kg_prefixes,
            share_memo: std::cell::RefCell::new(share_memo),
            hot_run,
            hottest,
            hot_held,
            tail_memo: std::cell::RefCell::new(tail_memo),
            kg_loads,
            factor: vec![1.0; n],
            decided_with: std::cell::Cell::new(None),
            frozen: vec![false; n],
            elapsed,
            flat_from: vec![0; n],
            outputs,
            flow,
            keyed_searches: std::cell::RefCell::new(vec![None; n]),
        })
    }
}
