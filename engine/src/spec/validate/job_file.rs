//! Reading a job file (resolving its relative paths), writing it back, and the checks of a job
//! a user wrote: outputs, scaling bounds, and its paths on this machine.

use super::*;

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
}
