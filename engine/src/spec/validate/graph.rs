//! The job graph: operators by name, their inputs and outputs, parallelism, a topological
//! order (naming a cycle) and the structure's fingerprint.

use super::*;

impl JobSpec {
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
}
