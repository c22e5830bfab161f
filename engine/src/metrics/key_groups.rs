//! The keyed subtasks' busiest key groups and their shares (`streamscale_key_group_share`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use super::{MetricsError, label_pairs};

/// The keyed subtasks' busiest key groups (`streamscale_key_group_share`, a gauge family with
/// the labels `operator`, `subtask` and `key_group`, the key group's index among the job's
/// `maxParallelism`): one series per listed key group, with its share of the subtask's recent
/// records ([`crate::keygroup::load::KeyGroupLoad::top`]).
///
/// Unlike a `GaugeVec`, a subtask's list is replaced as a whole ([`KeyGroupShareSeries::set`],
/// at each metrics flush, one lock), so a key group that is no longer among the busiest
/// disappears from the page and the family holds at most
/// [`crate::keygroup::load::TOP_KEY_GROUPS`] series per subtask whatever the number of key
/// groups; a subtask started again (a restart in place) starts from an empty list.
#[derive(Clone)]
pub struct KeyGroupShareVec {
    inner: Arc<KeyGroupShareFamily>,
}

struct KeyGroupShareFamily {
    desc: Desc,
    /// Lists by label values (`operator`, `subtask`): (key group, share), busiest first.
    series: Mutex<BTreeMap<[String; 2], SharedKeyGroupList>>,
}

/// One subtask's (key group, share) list, shared by its thread and the family.
type SharedKeyGroupList = Arc<Mutex<Vec<(u32, f64)>>>;

/// One subtask's list in a [`KeyGroupShareVec`].
#[derive(Clone)]
pub struct KeyGroupShareSeries {
    shared: SharedKeyGroupList,
}

impl KeyGroupShareSeries {
    /// Replaces the subtask's list with `top` ((key group, share in (0, 1]) pairs, busiest
    /// first).
    pub fn set(&self, top: &[(u32, f64)]) {
        let mut list = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        list.clear();
        list.extend_from_slice(top);
    }
}

impl KeyGroupShareVec {
    /// An empty family named `name`.
    ///
    /// # Errors
    /// [`prometheus::Error`] if the name or help is not valid.
    pub fn new(name: &str, help: &str) -> Result<KeyGroupShareVec, MetricsError> {
        let labels = ["operator", "subtask", "key_group"]
            .iter()
            .map(|l| (*l).to_string())
            .collect();
        let desc = Desc::new(name.into(), help.into(), labels, HashMap::new())?;
        Ok(KeyGroupShareVec {
            inner: Arc::new(KeyGroupShareFamily {
                desc,
                series: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The list of the subtask `[operator, subtask]`, emptied (nothing is published for it
    /// until the first [`KeyGroupShareSeries::set`]).
    pub fn series(&self, labels: [&str; 2]) -> KeyGroupShareSeries {
        let key = labels.map(str::to_string);
        let mut series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shared = series.entry(key).or_default().clone();
        shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        KeyGroupShareSeries { shared }
    }

    /// The list of the subtask `[operator, subtask]` as last set (`None` if it has none).
    pub fn get(&self, labels: [&str; 2]) -> Option<Vec<(u32, f64)>> {
        let key = labels.map(str::to_string);
        let series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let list = series.get(&key)?;
        Some(list.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

impl Collector for KeyGroupShareVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut metrics = Vec::new();
        for (values, list) in series.iter() {
            let list = list.lock().unwrap_or_else(PoisonError::into_inner);
            for &(group, share) in list.iter() {
                let mut labels = label_pairs(values);
                let mut pair = LabelPair::default();
                pair.set_name("key_group".to_string());
                pair.set_value(group.to_string());
                labels.push(pair);
                let mut g = proto::Gauge::default();
                g.set_value(share);
                let mut m = proto::Metric::from_label(labels);
                m.set_gauge(g);
                metrics.push(m);
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(self.inner.desc.fq_name.clone());
        family.set_help(self.inner.desc.help.clone());
        family.set_field_type(MetricType::GAUGE);
        family.set_metric(metrics);
        vec![family]
    }
}
