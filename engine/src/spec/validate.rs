//! Reading a job file (resolving its relative paths) and checking it: names, bounds, rates,
//! the graph, checkpoints and autoscaler settings, each error naming its field.

use super::*;

/// Longest `autoscaler.scaleDownLookbackSeconds` accepted, seconds (7 days).
const MAX_LOOKBACK_SECONDS: f64 = 7.0 * 86_400.0;

impl JobSpec {
    /// Reads, parses and validates a job file. Relative paths in it (trace files, sink
    /// `output`, checkpoint and disk-state directories) are resolved against the job file's
    /// directory.
    ///
    /// # Errors
    /// [`SpecError::Read`] if the file is unreadable, [`SpecError::Parse`] if it is not a job
    /// spec, [`SpecError::Invalid`] if the graph or a setting is invalid.
    pub fn from_file(path: &Path) -> Result<JobSpec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut spec = JobSpec::from_yaml(&text).map_err(|message| SpecError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for op in &mut spec.operators {
            match &mut op.kind {
                OperatorKind::Source {
                    rate: RateSpec::Trace(trace),
                    ..
                } if trace.file.is_relative() => trace.file = base.join(&trace.file),
                OperatorKind::Sink {
                    output: Some(out), ..
                } if out.is_relative() => *out = base.join(&*out),
                _ => {}
            }
        }
        if let Some(c) = &mut spec.checkpoint {
            let job_name = spec.name.clone();
            let dir = c
                .dir
                .get_or_insert_with(|| format!("checkpoints/{job_name}"));
            if !dir.contains("://") && Path::new(dir.as_str()).is_relative() {
                *dir = base.join(dir.as_str()).display().to_string();
            }
        }
        if spec.state.backend == StateBackendKind::Disk {
            let dir = spec.state.dir.get_or_insert_with(|| "state".into());
            if Path::new(dir.as_str()).is_relative() {
                *dir = base.join(dir.as_str()).display().to_string();
            }
        }
        spec.validate()
            .and_then(|()| spec.validate_job_file())
            .map_err(|problem| SpecError::Invalid {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(spec)
    }

    /// Reads a job file as [`Self::from_file`] does and checks its paths against this machine's
    /// file system ([`Self::check_file_paths`]), for the programs that run the job here (the
    /// engine, `streamscale run`). Readers that only plan or simulate it (`streamscale plan`,
    /// the simulator) use [`Self::from_file`]: the job may run elsewhere (a pod's volume).
    ///
    /// # Errors
    /// As [`Self::from_file`], and [`SpecError::Invalid`] naming the field, the path and the
    /// reason when a sink's `output` or the disk backend's `state.dir` is unusable.
    pub fn from_file_to_run(path: &Path) -> Result<Self, SpecError> {
        let spec = Self::from_file(path)?;
        spec.check_file_paths()
            .map_err(|problem| SpecError::Invalid {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(spec)
    }

    /// Parses YAML without validating the graph.
    ///
    /// # Errors
    /// When the text is not a job spec: `line L column C: FIELD: REASON`, naming the field the
    /// problem is about (`operators[2] (win).kind`, `operators[0] (src).rate.constant`) and
    /// pointing at its bad value, at the unknown key, or at the start of the mapping that lacks
    /// a required field; the parser's own first line when the text is not valid YAML.
    ///
    /// Unknown fields are errors for every operator kind (including `map`, whose kind has no
    /// fields of its own); the message lists the fields common to all kinds too.
    pub fn from_yaml(text: &str) -> Result<JobSpec, String> {
        let spec: JobSpec =
            serde_saphyr::from_str(text).map_err(|e| parse_error::explain(text, &e))?;
        // A source's `rate` defaults (for Kafka sources); every other source must name one.
        let unrated: Vec<usize> = spec
            .operators
            .iter()
            .enumerate()
            .filter(|(_, op)| {
                matches!(&op.kind, OperatorKind::Source { kafka: None, rate, .. } if *rate == kafka_source_rate())
            })
            .map(|(i, _)| i)
            .collect();
        if !unrated.is_empty() {
            let tree = yaml_tree::Node::parse(text);
            let items = tree.as_ref().and_then(|t| match &t.get("operators")?.kind {
                yaml_tree::Kind::Seq(items) => Some(items),
                _ => None,
            });
            for i in unrated {
                let Some(item) = items.and_then(|items| items.get(i)) else {
                    continue;
                };
                if !item
                    .entries()
                    .iter()
                    .any(|(k, _)| k.scalar() == Some("rate"))
                {
                    return Err(format!(
                        "line {} column {}: operators[{i}] ({}): missing field `rate` (a source needs `rate`: one of constant, steps, trace), or `kafka` to read a topic",
                        item.at.0, item.at.1, spec.operators[i].name
                    ));
                }
            }
        }
        // `map` has no fields of its own, and serde ignores extra keys on a unit variant of
        // a flattened enum: check them here.
        let maps = spec
            .operators
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op.kind, OperatorKind::Map));
        let any_map = spec
            .operators
            .iter()
            .any(|op| matches!(op.kind, OperatorKind::Map));
        let tree = any_map.then(|| yaml_tree::Node::parse(text)).flatten();
        let items = tree.as_ref().and_then(|t| match &t.get("operators")?.kind {
            yaml_tree::Kind::Seq(items) => Some(items),
            _ => None,
        });
        for (i, op) in maps {
            let Some(item) = items.and_then(|items| items.get(i)) else {
                continue;
            };
            if let Some((key, _)) = item.entries().iter().find(|(k, _)| {
                k.scalar()
                    .is_none_or(|k| !COMMON_OPERATOR_FIELDS.contains(&k))
            }) {
                return Err(format!(
                    "line {} column {}: operators[{i}] ({}): unknown field `{}` for kind `map`, expected one of {}",
                    key.at.0,
                    key.at.1,
                    op.name,
                    key.scalar().unwrap_or(&key.raw),
                    COMMON_OPERATOR_FIELDS.join(", ")
                ));
            }
        }
        Ok(spec)
    }

    /// Serializes the spec back to YAML.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# cannot serialize: {e}"))
    }

    /// Looks an operator up by name.
    pub fn operator(&self, name: &str) -> Option<&OperatorSpec> {
        self.operators.iter().find(|o| o.name == name)
    }

    /// Names of the operators feeding `name`.
    pub fn inputs_of(&self, name: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|e| e.to == name)
            .map(|e| e.from.as_str())
            .collect()
    }

    /// Names of the operators `name` feeds.
    pub fn outputs_of(&self, name: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|e| e.from == name)
            .map(|e| e.to.as_str())
            .collect()
    }

    /// Current parallelism per operator name.
    pub fn parallelism(&self) -> BTreeMap<String, u32> {
        self.operators
            .iter()
            .map(|o| (o.name.clone(), o.parallelism))
            .collect()
    }

    /// A copy of this spec with the given parallelism per operator (others unchanged).
    pub fn with_parallelism(&self, parallelism: &BTreeMap<String, u32>) -> JobSpec {
        let mut spec = self.clone();
        for op in &mut spec.operators {
            if let Some(p) = parallelism.get(&op.name) {
                op.parallelism = *p;
            }
        }
        spec
    }

    /// Operator names in a topological order (every edge goes from earlier to later).
    ///
    /// # Errors
    /// A message naming the operators on a cycle.
    pub fn topological_order(&self) -> Result<Vec<String>, String> {
        let mut indegree: BTreeMap<&str, usize> = self
            .operators
            .iter()
            .map(|o| (o.name.as_str(), 0))
            .collect();
        for e in &self.edges {
            if let Some(d) = indegree.get_mut(e.to.as_str()) {
                *d += 1;
            }
        }
        let mut ready: Vec<&str> = indegree
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(n, _)| *n)
            .collect();
        let mut order = Vec::with_capacity(self.operators.len());
        while let Some(n) = ready.pop() {
            order.push(n.to_string());
            for e in self.edges.iter().filter(|e| e.from == n) {
                if let Some(d) = indegree.get_mut(e.to.as_str()) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(e.to.as_str());
                    }
                }
            }
        }
        if order.len() < self.operators.len() {
            // Operators left over are on a cycle or downstream of one; keep those that can
            // reach themselves.
            let left: BTreeSet<&str> = indegree
                .iter()
                .filter(|(_, d)| **d > 0)
                .map(|(n, _)| *n)
                .collect();
            let on_cycle: Vec<&str> = left
                .iter()
                .copied()
                .filter(|n| self.reaches_itself(n, &left))
                .collect();
            return Err(format!(
                "edges: the graph has a cycle through operators {}; job graphs must be acyclic",
                on_cycle.join(", ")
            ));
        }
        Ok(order)
    }

    /// Checks a job a user wrote, beyond [`JobSpec::validate`] (which models built from
    /// partial graphs and running jobs also use): every operator but a sink has an output
    /// (else all its records would be lost), and every operator's `parallelism` lies within
    /// its `scaling` bounds. [`JobSpec::from_file`] applies it.
    ///
    /// # Errors
    /// The first problem, naming the operator and the field.
    pub fn validate_job_file(&self) -> Result<(), String> {
        for op in &self.operators {
            if !matches!(op.kind, OperatorKind::Sink { .. }) && self.outputs_of(&op.name).is_empty()
            {
                return Err(format!(
                    "edges: operator `{}` has no output; every record must reach a sink (add an edge from `{}` to a sink)",
                    op.name, op.name
                ));
            }
        }
        for (i, op) in self.operators.iter().enumerate() {
            let min = op.scaling.min.unwrap_or(1);
            let max = op.scaling.max.unwrap_or(self.max_parallelism);
            if !(min..=max).contains(&op.parallelism) {
                // `parallelism` defaults to 1: say so, since the user may not have written it.
                let default = if op.parallelism == 1 {
                    " (1 is the default when `parallelism` is not given; set it within the bounds)"
                } else {
                    ""
                };
                return Err(format!(
                    "operators[{i}] ({}).parallelism: {} is outside its scaling bounds min {min} .. max {max}{default}",
                    op.name, op.parallelism
                ));
            }
        }
        Ok(())
    }

    /// Checks the job file's paths against the file system, so that a path the engine could
    /// not use fails when the job file is read rather than once the job runs: a sink's `output`
    /// must not be an existing directory (records are appended to a file), an existing one must
    /// open for appending (opened, nothing written) and its directory must be one the engine can
    /// create it in (or create); the disk backend's `state.dir` must be a directory the engine
    /// can create entries in, or can create. "Can create" is tried
    /// ([`crate::writable_dir::check_usable_dir`]: an empty probe directory, removed at once;
    /// nothing is left behind). `checkpoint.dir` is not checked: checkpoint storage that
    /// cannot be written fails checkpoints, not the job (it may come back).
    ///
    /// # Errors
    /// The first problem, naming the operator or the field, the path and the reason.
    pub fn check_file_paths(&self) -> Result<(), String> {
        use crate::writable_dir::check_usable_dir;
        if self.state.backend == StateBackendKind::Disk {
            check_usable_dir(&self.state.dir_or_default())
                .map_err(|e| format!("state.dir: {e}"))?;
        }
        for (i, op) in self.operators.iter().enumerate() {
            let OperatorKind::Sink {
                output: Some(out),
                delivery,
                ..
            } = &op.kind
            else {
                continue;
            };
            let field = format!("operators[{i}] ({}).output", op.name);
            if *delivery == SinkDelivery::ExactlyOnce {
                if out.exists() && !out.is_dir() {
                    return Err(format!(
                        "{field}: {} is not a directory; an exactly-once sink publishes part files into a directory (or set `delivery: at-least-once` to append to a file)",
                        out.display()
                    ));
                }
                check_usable_dir(out).map_err(|e| format!("{field}: {e}"))?;
                continue;
            }
            if out.is_dir() {
                return Err(format!(
                    "{field}: {} is a directory; name a file (with `delivery: at-least-once` records are appended to it, one line each)",
                    out.display()
                ));
            }
            if out.exists() {
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(out)
                    .map_err(|e| format!("{field}: {} cannot be written: {e}", out.display()))?;
            } else if let Some(parent) = out.parent() {
                check_usable_dir(parent).map_err(|e| format!("{field}: {}: {e}", out.display()))?;
            }
        }
        Ok(())
    }

    /// Whether `start` can reach itself along edges that stay within `within`.
    fn reaches_itself(&self, start: &str, within: &BTreeSet<&str>) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for e in self.edges.iter().filter(|e| e.from == n) {
                let to = e.to.as_str();
                if to == start {
                    return true;
                }
                if within.contains(to) && seen.insert(to) {
                    stack.push(to);
                }
            }
        }
        false
    }

    /// A fingerprint of the job's structure (operator names, kinds and edges; not parallelism,
    /// costs or rates), used to check that a savepoint belongs to this job. 64 hex characters (SHA-256).
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.name.as_bytes());
        h.update(self.max_parallelism.to_le_bytes());
        let mut ops: Vec<(&str, &str)> = self
            .operators
            .iter()
            .map(|o| (o.name.as_str(), o.kind.name()))
            .collect();
        ops.sort();
        for (n, k) in ops {
            h.update(b"\0op\0");
            h.update(n.as_bytes());
            h.update(b"\0");
            h.update(k.as_bytes());
        }
        let mut edges: Vec<(&str, &str)> = self
            .edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect();
        edges.sort();
        for (f, t) in edges {
            h.update(b"\0edge\0");
            h.update(f.as_bytes());
            h.update(b"\0");
            h.update(t.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

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
        let a = &self.autoscaler;
        if !(a.target_utilization > 0.0 && a.target_utilization <= 1.0) {
            return Err(format!(
                "autoscaler.targetUtilization: {} is not in (0, 1]",
                a.target_utilization
            ));
        }
        if !(a.latency_slo_seconds > 0.0 && a.latency_slo_seconds.is_finite()) {
            return Err(format!(
                "autoscaler.latencySloSeconds: {} must be a positive number of seconds",
                a.latency_slo_seconds
            ));
        }
        if !(a.latency_percentile > 0.0 && a.latency_percentile < 1.0) {
            return Err(format!(
                "autoscaler.latencyPercentile: {} is not in (0, 1) (0.99 is p99)",
                a.latency_percentile
            ));
        }
        if !(a.catch_up_seconds > 0.0 && a.catch_up_seconds.is_finite()) {
            return Err(format!(
                "autoscaler.catchUpSeconds: {} must be a positive number of seconds",
                a.catch_up_seconds
            ));
        }
        if let Some(l) = a.scale_down_lookback_seconds
            && !(0.0..=MAX_LOOKBACK_SECONDS).contains(&l)
        {
            return Err(format!(
                "autoscaler.scaleDownLookbackSeconds: {l} must be 0 (off) or a number of seconds up to {MAX_LOOKBACK_SECONDS} (7 days); to keep an operator from scaling down, give it a scaling.min"
            ));
        }
        if let Some(m) = a.max_utilization
            && !(m >= a.target_utilization && m <= 1.0)
        {
            return Err(format!(
                "autoscaler.maxUtilization: {m} must be in [targetUtilization ({}), 1]",
                a.target_utilization
            ));
        }
        if let Some(m) = a.min_utilization
            && !(m > 0.0 && m <= a.target_utilization)
        {
            return Err(format!(
                "autoscaler.minUtilization: {m} must be in (0, targetUtilization ({})]",
                a.target_utilization
            ));
        }
        if let Some(f) = &a.forecast {
            if !(f.season_seconds > 0.0 && f.season_seconds.is_finite()) {
                return Err(format!(
                    "autoscaler.forecast.seasonSeconds: {} must be a positive number of seconds",
                    f.season_seconds
                ));
            }
            if let Some(b) = f
                .bin_seconds
                .filter(|b| !(*b > 0.0 && *b <= f.season_seconds / 2.0))
            {
                return Err(format!(
                    "autoscaler.forecast.binSeconds: {b} must be positive and at most half of seasonSeconds ({})",
                    f.season_seconds
                ));
            }
            if let Some(h) = f
                .horizon_seconds
                .filter(|h| !(*h >= 0.0 && *h <= f.season_seconds))
            {
                return Err(format!(
                    "autoscaler.forecast.horizonSeconds: {h} must be in [0, seasonSeconds ({})]",
                    f.season_seconds
                ));
            }
            if !(f.max_error > 0.0 && f.max_error.is_finite()) {
                return Err(format!(
                    "autoscaler.forecast.maxError: {} must be a positive share (0.3 = 30%)",
                    f.max_error
                ));
            }
        }
        if let Some(l) = &a.limits {
            if !(0.0..=1.0).contains(&l.max_shed_share) {
                return Err(format!(
                    "autoscaler.limits.maxShedShare: {} is not in [0, 1]",
                    l.max_shed_share
                ));
            }
            if l.quota_subtasks == Some(0) {
                return Err("autoscaler.limits.quotaSubtasks: must be at least 1".into());
            }
        }
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

/// A Kafka client's `security` that this build can use ([`crate::kafka::security`]).
fn validate_kafka_security(
    at: &str,
    security: Option<&crate::kafka::security::KafkaSecurity>,
) -> Result<(), String> {
    match security {
        Some(s) => s
            .validate(
                &format!("{at}.security"),
                &crate::kafka::security::builtin_features(),
            )
            .map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// A Kafka `topic` and `bootstrapServers` that can be used: a legal topic name (1 to 249 of
/// letters, digits, `.`, `_`, `-`) and a non-empty `host:port[,host:port...]` list.
fn validate_kafka_endpoint(at: &str, topic: &str, servers: &str) -> Result<(), String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if topic.is_empty()
        || topic.len() > 249
        || !topic.chars().all(legal)
        || topic == "."
        || topic == ".."
    {
        return Err(format!(
            "{at}.topic: `{topic}` is not a Kafka topic name (1 to 249 letters, digits, `.`, `_`, `-`)"
        ));
    }
    let bad = servers.split(',').map(str::trim).find(|s| {
        s.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    });
    if let Some(b) = bad {
        return Err(format!(
            "{at}.bootstrapServers: `{b}` is not host:port (write e.g. \"127.0.0.1:9092\", several separated by commas)"
        ));
    }
    Ok(())
}

pub(super) fn validate_rate(at: &str, rate: &RateSpec) -> Result<(), String> {
    let ok_rate = |r: f64| r >= 0.0 && r.is_finite();
    match rate {
        RateSpec::Constant(r) if !ok_rate(*r) => Err(format!(
            "{at}.rate.constant: {r} must be a finite, non-negative number of records/s"
        )),
        RateSpec::Steps(steps) => {
            if steps.is_empty() {
                return Err(format!("{at}.rate.steps: needs at least one step"));
            }
            let mut last = f64::NEG_INFINITY;
            for (j, s) in steps.iter().enumerate() {
                if !ok_rate(s.records_per_second) {
                    return Err(format!(
                        "{at}.rate.steps[{j}].recordsPerSecond: {} must be a finite, non-negative number of records/s",
                        s.records_per_second
                    ));
                }
                if !(s.at_seconds.is_finite() && s.at_seconds >= 0.0 && s.at_seconds > last) {
                    return Err(format!(
                        "{at}.rate.steps[{j}].atSeconds: {} must be finite, >= 0 and increasing",
                        s.at_seconds
                    ));
                }
                last = s.at_seconds;
            }
            Ok(())
        }
        RateSpec::Trace(t) => {
            if !(t.scale > 0.0 && t.scale.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.scale: {} must be a finite, positive number",
                    t.scale
                ));
            }
            if !(t.speedup > 0.0 && t.speedup.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.speedup: {} must be a finite, positive number",
                    t.speedup
                ));
            }
            if !(t.start_seconds >= 0.0 && t.start_seconds.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.startSeconds: {} must be a finite, non-negative number of seconds",
                    t.start_seconds
                ));
            }
            if let Some(end) = t.end_seconds
                && end <= t.start_seconds
            {
                return Err(format!(
                    "{at}.rate.trace.endSeconds: {end} must be after startSeconds {}",
                    t.start_seconds
                ));
            }
            if !t.file.is_file() {
                return Err(format!(
                    "{at}.rate.trace.file: trace file {} {}",
                    t.file.display(),
                    if t.file.is_dir() {
                        "is a directory, not a trace CSV"
                    } else {
                        "does not exist"
                    }
                ));
            }
            // A start at or past the trace's last row would replay nothing.
            if let Ok(trace) = crate::trace::Trace::from_file(&t.file)
                && t.start_seconds >= trace.end()
            {
                return Err(format!(
                    "{at}.rate.trace.startSeconds: {} is at or past the end of trace {} ({} s)",
                    t.start_seconds,
                    t.file.display(),
                    trace.end()
                ));
            }
            Ok(())
        }
        RateSpec::Constant(_) => Ok(()),
    }
}

/// A Kafka source's `schema`, `keyBy` and `valueField` (`at`: `operators[i] (name).kafka`):
/// well-formed paths, and with a schema, fields of it (`valueField` numeric).
fn validate_kafka_fields(at: &str, k: &crate::kafka::KafkaSourceSpec) -> Result<(), String> {
    use crate::json_field::check_path;
    if let Some(schema) = &k.schema {
        schema.validate().map_err(|e| format!("{at}.schema.{e}"))?;
    }
    if let Some(f) = k.key_field() {
        check_path(f).map_err(|e| format!("{at}.keyBy: {e} (or `kafkaKey`)"))?;
        if let Some(schema) = &k.schema {
            schema.field(f).map_err(|e| format!("{at}.keyBy: {e}"))?;
        }
    }
    if let Some(f) = &k.value_field {
        check_path(f).map_err(|e| format!("{at}.valueField: {e}"))?;
        if let Some(schema) = &k.schema {
            let t = schema
                .field(f)
                .map_err(|e| format!("{at}.valueField: {e}"))?;
            if !t.is_numeric() {
                return Err(format!(
                    "{at}.valueField: field `{f}` is {} in schema `{}`; windows aggregate a numeric (int or float) field",
                    t.name(),
                    schema.name
                ));
            }
        }
    }
    Ok(())
}

impl JobSpec {
    /// A window's `aggregates` (`at`: the field): a well-formed list, and one that reads values
    /// (`sum`, `min`, `max`) only from Kafka sources that name their `valueField`.
    fn validate_aggregates(
        &self,
        at: &str,
        window: &str,
        list: &[crate::aggregates::Aggregate],
    ) -> Result<(), String> {
        crate::aggregates::validate(at, list)?;
        let Some((i, a)) = list.iter().enumerate().find(|(_, a)| a.reads_values()) else {
            return Ok(());
        };
        for src in self.upstream_sources(window) {
            if let OperatorKind::Source { kafka: Some(k), .. } = &src.kind
                && k.value_field.is_none()
            {
                return Err(format!(
                    "{at}[{i}]: `{}` aggregates the values of Kafka source `{}`, which names no `valueField` (the numeric JSON field to aggregate)",
                    a.name(),
                    src.name
                ));
            }
        }
        Ok(())
    }

    /// The sources operator `name` reads from (through any operators between), each once.
    fn upstream_sources(&self, name: &str) -> Vec<&OperatorSpec> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![name];
        let mut out = Vec::new();
        while let Some(n) = todo.pop() {
            for e in self.edges.iter().filter(|e| e.to == n) {
                if !seen.insert(e.from.as_str()) {
                    continue;
                }
                match self.operators.iter().find(|o| o.name == e.from) {
                    Some(o) if matches!(o.kind, OperatorKind::Source { .. }) => out.push(o),
                    Some(_) => todo.push(e.from.as_str()),
                    None => {}
                }
            }
        }
        out
    }

    /// A `filter`'s `where` (`at`: its place in the file): every source upstream of `name`
    /// reads Kafka, and the condition fits the schema of those that name one.
    fn validate_condition(
        &self,
        at: &str,
        name: &str,
        c: &crate::json_field::Condition,
    ) -> Result<(), String> {
        for src in self.upstream_sources(name) {
            match &src.kind {
                OperatorKind::Source { kafka: Some(k), .. } => {
                    if let Some(schema) = &k.schema {
                        c.check(schema).map_err(|e| format!("{at}: {e}"))?;
                    }
                }
                _ => {
                    return Err(format!(
                        "{at}: `{c}` needs records with JSON values, from a Kafka source; source `{}` generates records",
                        src.name
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod json_field_tests {
    use super::*;

    fn job(src_kafka: &str, filter: &str) -> String {
        format!(
            r#"name: j
operators:
  - name: src
    kind: source
    kafka: {{ topic: t, bootstrapServers: "127.0.0.1:9092", {src_kafka} }}
  - {{ name: big, kind: filter, {filter} }}
  - {{ name: win, kind: window, sizeMs: 1000 }}
  - {{ name: out, kind: sink }}
edges:
  - {{ from: src, to: big }}
  - {{ from: big, to: win }}
  - {{ from: win, to: out }}
"#
        )
    }

    fn check(yaml: &str) -> Result<JobSpec, String> {
        let spec = JobSpec::from_yaml(yaml).map_err(|e| e.to_string())?;
        spec.validate()?;
        Ok(spec)
    }

    const SCHEMA: &str =
        "schema: { name: tweet, fields: { user: string, likes: int, lang: string } }";

    #[test]
    fn kafka_event_time_feeds_event_windows_and_is_checked() {
        let job = |event_time: &str| {
            format!(
                r#"name: j
operators:
  - {{ name: src, kind: source, kafka: {{ topic: t, bootstrapServers: "127.0.0.1:9092"{event_time} }} }}
  - {{ name: win, kind: eventWindow, key: key, window: {{ tumbling: {{ sizeMs: 1000 }} }} }}
  - {{ name: out, kind: sink }}
edges:
  - {{ from: src, to: win }}
  - {{ from: win, to: out }}
"#
            )
        };
        let spec = check(&job(
            ", eventTime: { maxOutOfOrdernessMs: 500, idleTimeoutMs: 2000 }",
        ))
        .expect("valid");
        let OperatorKind::Source { kafka: Some(k), .. } = &spec.operators[0].kind else {
            panic!("a Kafka source")
        };
        assert_eq!(
            k.event_time,
            Some(crate::kafka::KafkaEventTime {
                max_out_of_orderness_ms: 500,
                idle_timeout_ms: Some(2000)
            })
        );
        let err = check(&job("")).unwrap_err();
        assert!(
            err.contains("`win` (eventWindow) needs records with event time as input")
                && err.contains("a Kafka source with `eventTime`"),
            "{err}"
        );
        let err = check(&job(", eventTime: { idleTimeoutMs: 0 }")).unwrap_err();
        assert!(
            err.contains("operators[0] (src).kafka.eventTime.idleTimeoutMs: must be at least 1 ms"),
            "{err}"
        );
        let err = check(&job(", eventTime: { idleMs: 5 }")).unwrap_err();
        assert!(err.contains("idleMs"), "{err}");
    }

    #[test]
    fn window_aggregates_are_checked_naming_the_field() {
        let with = |src: &str, aggregates: &str| {
            check(&job(src, "keep: 1").replace(
                "sizeMs: 1000 }",
                &format!("sizeMs: 1000, aggregates: {aggregates} }}"),
            ))
        };
        let spec = with("valueField: likes", "[count, min, max]").expect("valid");
        assert!(matches!(
            &spec.operators[2].kind,
            OperatorKind::Window { aggregates: Some(a), .. } if a.len() == 3
        ));
        for (src, aggregates, needle) in [
            (
                "keyBy: user",
                "[count, max]",
                "operators[2] (win).aggregates[1]: `max` aggregates the values of Kafka source `src`, which names no `valueField`",
            ),
            (
                "valueField: likes",
                "[]",
                "operators[2] (win).aggregates: must list at least one of count, sum, min, max",
            ),
            (
                "valueField: likes",
                "[min, min]",
                "operators[2] (win).aggregates[1]: `min` is listed twice",
            ),
            ("valueField: likes", "[median]", "median"),
        ] {
            let err = with(src, aggregates).expect_err(aggregates);
            assert!(err.contains(needle), "{aggregates}: {err}");
        }
        // Counting alone needs no valueField.
        with("keyBy: user", "[count]").expect("count reads no values");
    }

    #[test]
    fn a_schema_keyby_valuefield_and_where_that_fit_are_accepted() {
        let spec = check(&job(
            &format!("keyBy: user, valueField: likes, {SCHEMA}"),
            r#"where: "likes >= 10""#,
        ))
        .expect("valid");
        let OperatorKind::Filter { condition, keep } = &spec.operators[1].kind else {
            panic!("a filter")
        };
        assert_eq!(*keep, 1.0);
        assert_eq!(
            condition.as_ref().expect("where").to_string(),
            "likes >= 10"
        );
    }

    #[test]
    fn bad_fields_are_clear_errors_naming_the_place() {
        for (src, filter, needle) in [
            (
                format!("keyBy: name, {SCHEMA}"),
                "keep: 1",
                "operators[0] (src).kafka.keyBy: field `name` is not in schema `tweet` (its fields: lang, likes, user)",
            ),
            (
                format!("valueField: lang, {SCHEMA}"),
                "keep: 1",
                "operators[0] (src).kafka.valueField: field `lang` is string in schema `tweet`; windows aggregate a numeric",
            ),
            (
                "keyBy: \"a..b\"".to_string(),
                "keep: 1",
                "operators[0] (src).kafka.keyBy: `a..b` is not a field path",
            ),
            (
                SCHEMA.to_string(),
                r#"where: "user > 3""#,
                "operators[1] (big).where: `user > 3`: field `user` is string in schema `tweet`",
            ),
            (
                SCHEMA.to_string(),
                r#"where: "likes >> 3""#,
                "`likes >> 3`: `> 3` is not a value",
            ),
            (
                "schema: { name: tweet, fields: {} }".to_string(),
                "keep: 1",
                "operators[0] (src).kafka.schema.fields: a schema needs at least one field",
            ),
        ] {
            let e = check(&job(&src, filter)).expect_err("invalid");
            assert!(e.contains(needle), "{src} / {filter}: {e}");
        }
    }

    #[test]
    fn where_needs_a_kafka_source() {
        let yaml = r#"name: j
operators:
  - { name: src, kind: source, rate: { constant: 10 } }
  - { name: f, kind: filter, where: "likes > 1" }
  - { name: out, kind: sink }
edges:
  - { from: src, to: f }
  - { from: f, to: out }
"#;
        let e = check(yaml).expect_err("invalid");
        assert!(
            e.contains("operators[1] (f).where: `likes > 1` needs records with JSON values, from a Kafka source; source `src` generates records"),
            "{e}"
        );
    }

    #[test]
    fn an_exactly_once_sink_needs_checkpoints() {
        let job = |sink: &str, checkpoint: &str| {
            format!(
                r#"name: j
operators:
  - {{ name: src, kind: source, rate: {{ constant: 10 }} }}
  - {{ name: m, kind: map }}
  - {{ name: log, kind: sink }}
  - {{ name: out, kind: sink, {sink} }}
edges:
  - {{ from: src, to: m }}
  - {{ from: m, to: log }}
  - {{ from: m, to: out }}
{checkpoint}"#
            )
        };
        let kafka = r#"kafka: { topic: t, bootstrapServers: "127.0.0.1:9092" }"#;
        let kafka_why = "writes `kafka` in transactions committed when a checkpoint completes";
        let file_why = "publishes `output` when a checkpoint completes (or at the end of input, which source `src` never reaches)";
        for (sink, why) in [
            (kafka.to_string(), kafka_why),
            (format!("delivery: exactly-once, {kafka}"), kafka_why),
            ("output: out".to_string(), file_why),
            ("delivery: exactly-once, output: out".to_string(), file_why),
        ] {
            let e = check(&job(&sink, "")).expect_err(&sink);
            assert_eq!(
                e,
                format!(
                    "operators[3] (out).delivery: exactly-once (the default) {why}, so the job needs `checkpoint: {{intervalSeconds: ...}}`; add one, or set `delivery: at-least-once`"
                ),
                "{sink}"
            );
            check(&job(&sink, "checkpoint: { intervalSeconds: 1 }\n")).expect(&sink);
            let at_least_once = format!("delivery: at-least-once, {sink}").replace(
                "delivery: at-least-once, delivery: exactly-once, ",
                "delivery: at-least-once, ",
            );
            check(&job(&at_least_once, "")).expect(&at_least_once);
        }
        // A sink that only counts (no output) is fine either way.
        check(&job("delivery: exactly-once", "")).expect("a counting sink");
        // A bounded job publishes its files at the end of input; its Kafka transactions
        // would still stay open until then.
        let bounded = |sink: &str| {
            job(sink, "").replace(
                "rate: { constant: 10 }",
                "rate: { constant: 10 }, count: 100",
            )
        };
        check(&bounded("output: out")).expect("a bounded job's files");
        let e = check(&bounded(kafka)).expect_err("a bounded job's kafka");
        assert!(e.contains(kafka_why), "{e}");
        let e = check(&job(
            r#"kafka: { topic: t, bootstrapServers: "127.0.0.1:9092", transactionTimeoutMs: 500 }"#,
            "checkpoint: { intervalSeconds: 1 }\n",
        ))
        .expect_err("timeout too short");
        assert!(
            e.starts_with("operators[3] (out).kafka.transactionTimeoutMs: 500 is out of range"),
            "{e}"
        );
    }
}
