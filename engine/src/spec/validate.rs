//! Reading a job file (resolving its relative paths) and checking it: names, bounds, rates,
//! the graph, checkpoints and autoscaler settings, each error naming its field.
//!
//! Here: [`JobSpec::validate`] (job-wide bounds, checkpoints, operators, edges). By concept:
//! `job_file` (reading and writing a job file, the checks of a job a user wrote), `graph`
//! (lookups, topological order, fingerprint), `autoscaler` (its settings), `sources` (Kafka
//! endpoints, security and fields; generated rates), `aggregates` (windows' aggregates and
//! `where` conditions).

use super::*;

mod aggregates;
mod autoscaler;
mod graph;
mod job_file;
mod sources;
use sources::{
    validate_kafka_endpoint, validate_kafka_fields, validate_kafka_security, validate_rate,
};

impl JobSpec {
    /// Checks the graph and every setting.
    ///
    /// # Errors
    /// The first problem found, naming the field (e.g. `operators[2] (enrich).parallelism`).
    pub fn validate(&self) -> Result<(), String> {
        if !valid_job_name(&self.name) {
            return Err(format!(
                "name: `{}` is not a valid job name (use 1 to {MAX_NAME_LEN} letters, digits, `-` and `_`)",
                self.name
            ));
        }
        if self.max_parallelism == 0 || self.max_parallelism > MAX_KEY_GROUPS {
            return Err(format!(
                "maxParallelism: {} is out of range 1..={MAX_KEY_GROUPS}",
                self.max_parallelism
            ));
        }
        if self.channel_capacity == 0 || self.channel_capacity > MAX_CHANNEL_CAPACITY {
            return Err(format!(
                "channelCapacity: {} is out of range 1..={MAX_CHANNEL_CAPACITY} records",
                self.channel_capacity
            ));
        }
        if self.operators.is_empty() {
            return Err("operators: the job has no operators".into());
        }
        self.validate_autoscaler()?;
        if let Some(c) = &self.checkpoint {
            if !(c.interval_seconds > 0.0 && c.interval_seconds.is_finite()) {
                return Err(format!(
                    "checkpoint.intervalSeconds: {} must be a positive number of seconds",
                    c.interval_seconds
                ));
            }
            if c.retain == 0 {
                return Err("checkpoint.retain: must be at least 1".into());
            }
            if !(c.timeout_seconds > 0.0 && c.timeout_seconds.is_finite()) {
                return Err(format!(
                    "checkpoint.timeoutSeconds: {} must be a positive number of seconds",
                    c.timeout_seconds
                ));
            }
            if !(c.restart.delay_seconds >= 0.0 && c.restart.delay_seconds.is_finite()) {
                return Err(format!(
                    "checkpoint.restart.delaySeconds: {} must be a non-negative number of seconds",
                    c.restart.delay_seconds
                ));
            }
        }
        self.state.validate()?;
        let mut names = BTreeSet::new();
        for (i, op) in self.operators.iter().enumerate() {
            let at = format!("operators[{i}] ({})", op.name);
            if !valid_job_name(&op.name) {
                return Err(format!(
                    "operators[{i}].name: `{}` is not a valid operator name (use 1 to {MAX_NAME_LEN} letters, digits, `-` and `_`)",
                    op.name
                ));
            }
            if !names.insert(op.name.as_str()) {
                return Err(format!("{at}.name: duplicate operator name `{}`", op.name));
            }
            if op.parallelism == 0 {
                return Err(format!("{at}.parallelism: must be at least 1"));
            }
            if op.parallelism > self.max_parallelism {
                return Err(format!(
                    "{at}.parallelism: {} exceeds maxParallelism {}",
                    op.parallelism, self.max_parallelism
                ));
            }
            for (field, v) in [("cpu", op.cpu), ("io", op.io)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return Err(format!(
                        "{at}.{field}: {v} is not allowed, it must be a finite number of microseconds >= 0"
                    ));
                }
            }
            let min = op.scaling.min.unwrap_or(1);
            let max = op.scaling.max.unwrap_or(self.max_parallelism);
            if min == 0 || min > max || max > self.max_parallelism {
                return Err(format!(
                    "{at}.scaling: need 1 <= min ({min}) <= max ({max}) <= maxParallelism ({})",
                    self.max_parallelism
                ));
            }
            match &op.kind {
                OperatorKind::Source {
                    rate,
                    keys,
                    nexmark,
                    kafka,
                    count,
                } => {
                    if kafka.is_none() && (op.cpu != 0.0 || op.io != 0.0) {
                        return Err(format!(
                            "{at}: generated sources have no per-record cost (a Kafka source may have one); remove `cpu`/`io`"
                        ));
                    }
                    if let Some(k) = kafka {
                        if *rate != kafka_source_rate()
                            || *keys != default_keys()
                            || count.is_some()
                            || nexmark.is_some()
                        {
                            return Err(format!(
                                "{at}.kafka: a Kafka source takes no `rate`, `keys`, `count` or `nexmark` (its records come from the topic)"
                            ));
                        }
                        validate_kafka_endpoint(
                            &format!("{at}.kafka"),
                            &k.topic,
                            &k.bootstrap_servers,
                        )?;
                        validate_kafka_security(&format!("{at}.kafka"), k.security.as_ref())?;
                        if k.group.as_deref().is_some_and(str::is_empty) {
                            return Err(format!("{at}.kafka.group: must not be empty"));
                        }
                        validate_kafka_fields(&format!("{at}.kafka"), k)?;
                        if k.event_time.and_then(|e| e.idle_timeout_ms) == Some(0) {
                            return Err(format!(
                                "{at}.kafka.eventTime.idleTimeoutMs: must be at least 1 ms (leave it out for partitions that never idle)"
                            ));
                        }
                        continue;
                    }
                    if *keys == 0 {
                        return Err(format!("{at}.keys: must be at least 1"));
                    }
                    validate_rate(&at, rate)?;
                    if let Some(n) = nexmark {
                        n.validate(&at)?;
                    }
                }
                OperatorKind::EventWindow { window, .. } => {
                    window.validate(&format!("{at}.window"))?;
                    if let WindowSpec::Sliding { size_ms, slide_ms } = *window
                        && size_ms.div_ceil(slide_ms.max(1)) > MAX_WINDOWS_PER_RECORD
                    {
                        return Err(format!(
                            "{at}.window.sliding: sizeMs / slideMs = {size_ms} / {slide_ms} puts each record in more than {MAX_WINDOWS_PER_RECORD} windows; use a larger slideMs"
                        ));
                    }
                }
                OperatorKind::Join { window: Some(w) } => {
                    w.validate(&format!("{at}.window"))?;
                    if w.tumbling_size().is_none() {
                        return Err(format!(
                            "{at}.window: a join supports only `tumbling` windows"
                        ));
                    }
                }
                OperatorKind::Select { .. }
                | OperatorKind::WindowTop { .. }
                | OperatorKind::Join { window: None } => {}
                OperatorKind::Filter { keep, condition } => {
                    if !(0.0..=1.0).contains(keep) {
                        return Err(format!("{at}.keep: {keep} is not between 0 and 1"));
                    }
                    if let Some(c) = condition {
                        self.validate_condition(&format!("{at}.where"), &op.name, c)?;
                    }
                }
                OperatorKind::Window {
                    size_ms,
                    aggregates,
                } => {
                    if *size_ms == 0 {
                        return Err(format!("{at}.sizeMs: must be at least 1 millisecond"));
                    }
                    if let Some(list) = aggregates {
                        self.validate_aggregates(&format!("{at}.aggregates"), &op.name, list)?;
                    }
                }
                OperatorKind::Sink {
                    output,
                    kafka,
                    delivery,
                } => {
                    if let Some(k) = kafka {
                        if output.is_some() {
                            return Err(format!(
                                "{at}: a sink writes either to `output` or to `kafka`, not both"
                            ));
                        }
                        validate_kafka_endpoint(
                            &format!("{at}.kafka"),
                            &k.topic,
                            &k.bootstrap_servers,
                        )?;
                        validate_kafka_security(&format!("{at}.kafka"), k.security.as_ref())?;
                        if let Some(t) = k.transaction_timeout_ms
                            && !(1_000..=900_000).contains(&t)
                        {
                            return Err(format!(
                                "{at}.kafka.transactionTimeoutMs: {t} is out of range 1000..=900000 ms (the brokers' default transaction.max.timeout.ms is 15 min)"
                            ));
                        }
                    }
                    // An exactly-once sink publishes what a completed checkpoint covers; without
                    // periodic checkpoints nothing is published before a savepoint or the end
                    // of input. A job whose sources all stop at their `count` publishes its
                    // files at the end (FLIP-147); a Kafka transaction open that long is
                    // aborted by the brokers after its timeout, so Kafka needs checkpoints.
                    let unbounded = self.operators.iter().find(|o| {
                        matches!(&o.kind, OperatorKind::Source { count, kafka, .. }
                            if count.is_none() || kafka.is_some())
                    });
                    if *delivery == SinkDelivery::ExactlyOnce && self.checkpoint.is_none() {
                        let why = match (kafka.is_some(), output.is_some(), unbounded) {
                            (true, _, _) => Some(
                                "writes `kafka` in transactions committed when a checkpoint completes"
                                    .to_string(),
                            ),
                            (false, true, Some(src)) => Some(format!(
                                "publishes `output` when a checkpoint completes (or at the end of input, which source `{}` never reaches)",
                                src.name
                            )),
                            _ => None,
                        };
                        if let Some(why) = why {
                            return Err(format!(
                                "{at}.delivery: exactly-once (the default) {why}, so the job needs `checkpoint: {{intervalSeconds: ...}}`; add one, or set `delivery: at-least-once`"
                            ));
                        }
                    }
                }
                OperatorKind::Map => {}
            }
        }
        let subtasks: u64 = self
            .operators
            .iter()
            .filter(|o| !matches!(o.kind, OperatorKind::Source { .. }))
            .map(|o| u64::from(o.parallelism))
            .sum();
        let slots = subtasks.saturating_mul(self.channel_capacity as u64);
        if slots > MAX_CHANNEL_SLOTS {
            return Err(format!(
                "channelCapacity: {} records × {subtasks} non-source subtasks = {slots} channel slots exceeds {MAX_CHANNEL_SLOTS}; lower channelCapacity or parallelism",
                self.channel_capacity
            ));
        }
        for (i, e) in self.edges.iter().enumerate() {
            for (field, end) in [("from", &e.from), ("to", &e.to)] {
                if !names.contains(end.as_str()) {
                    return Err(format!(
                        "edges[{i}].{field}: no operator named `{end}` ({} -> {})",
                        e.from, e.to
                    ));
                }
            }
            if self.edges[..i].contains(e) {
                return Err(format!("edges[{i}]: duplicate edge {} -> {}", e.from, e.to));
            }
        }
        for op in &self.operators {
            let ins = self.inputs_of(&op.name).len();
            let outs = self.outputs_of(&op.name).len();
            match op.kind {
                OperatorKind::Source { .. } if ins > 0 => {
                    return Err(format!("edges: source `{}` cannot have inputs", op.name));
                }
                OperatorKind::Sink { .. } if outs > 0 => {
                    return Err(format!("edges: sink `{}` cannot have outputs", op.name));
                }
                OperatorKind::Source { .. } => {}
                _ if ins == 0 => {
                    return Err(format!(
                        "edges: operator `{}` has no input; only sources may have none",
                        op.name
                    ));
                }
                _ => {}
            }
            // Event-time operators need event-time input (watermarks in order with records).
            if matches!(op.kind, OperatorKind::Sink { .. }) || !op.kind.emits_event_time() {
                continue;
            }
            for from in self.inputs_of(&op.name) {
                let Some(up) = self.operator(from) else {
                    continue;
                };
                if !up.kind.emits_event_time() {
                    return Err(format!(
                        "edges: `{}` ({}) needs records with event time as input, but `{}` ({}) does not emit them; feed it from a source with a `nexmark` block, a Kafka source with `eventTime`, or another event-time operator",
                        op.name,
                        op.kind.name(),
                        up.name,
                        up.kind.name()
                    ));
                }
                if matches!(op.kind, OperatorKind::WindowTop { .. })
                    && !matches!(up.kind, OperatorKind::EventWindow { .. })
                {
                    return Err(format!(
                        "edges: `{}` (windowTop) must be fed by an eventWindow, not `{}` ({})",
                        op.name,
                        up.name,
                        up.kind.name()
                    ));
                }
            }
        }
        self.topological_order()?;
        Ok(())
    }
}

#[cfg(test)]
mod json_field_tests;
