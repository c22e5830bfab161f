//! Checks of a window's `aggregates` and of `where` conditions against the sources upstream.

use super::*;

impl JobSpec {
    /// A window's `aggregates` (`at`: the field): a well-formed list, and one that reads values
    /// (`sum`, `min`, `max`) only from Kafka sources that name their `valueField`.
    pub(super) fn validate_aggregates(
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
    pub(super) fn upstream_sources(&self, name: &str) -> Vec<&OperatorSpec> {
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
    pub(super) fn validate_condition(
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
