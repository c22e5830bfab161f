//! The engine's metrics read from a Prometheus server's HTTP API (`spec.autoscaler.prometheus`)
//! instead of the engine's own `/metrics`.
//!
//! One instant query (`GET URL/api/v1/query`) of a range selector over the planner's
//! per-subtask families ([`FAMILIES`], the same names and meaning as the engine's `/metrics`)
//! returns each series' recent raw samples with the time Prometheus scraped them. The newest
//! scrape is kept (series that are not in it belong to an engine that has gone, for example
//! at another parallelism before a rescale), turned back into exposition text and parsed by
//! the same [`streamscale_controller::scrape::parse_metrics`] as a direct scrape, so the
//! planner sees identical samples either way. The sample is stamped with the scrape's time on
//! the caller's clock, not the query's, so rates are computed over the real scrape interval.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use streamscale_controller::collect::{MetricsSource, Reading};
use streamscale_controller::model::MetricSample;
use streamscale_controller::scrape::{
    self, BACKPRESSURED, BUSY, EngineMetrics, IDLE, QUEUE_LENGTH, RECORDS_IN, RECORDS_OUT,
    SOURCE_ARRIVALS, SOURCE_BACKLOG, ScrapeError,
};

/// The metric families the planner reads, queried from Prometheus.
pub const FAMILIES: [&str; 8] = [
    RECORDS_IN,
    RECORDS_OUT,
    BUSY,
    IDLE,
    BACKPRESSURED,
    QUEUE_LENGTH,
    SOURCE_BACKLOG,
    SOURCE_ARRIVALS,
];

/// Seconds of raw samples asked for: the newest scrape must fall within it.
pub const LOOKBACK_S: u32 = 120;

/// Errors reading metrics from Prometheus.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The request failed (connection refused, timeout, unreadable body).
    #[error("GET {url}: {source}")]
    Http {
        /// The query URL.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// Prometheus refused the query or answered something that is not a query result.
    #[error("{url}: {message}")]
    Answer {
        /// The query URL.
        url: String,
        /// What is wrong (Prometheus' own error when it gave one).
        message: String,
    },
    /// No series matched: the engine is not scraped (yet), or the selector is wrong.
    #[error("{url}: no streamscale series match {{{selector}}} in the last {LOOKBACK_S} s")]
    Empty {
        /// The query URL.
        url: String,
        /// The label matchers used.
        selector: String,
    },
    /// The series could not be read as the engine's metrics.
    #[error(transparent)]
    Parse(#[from] ScrapeError),
}

/// One read of the engine's metrics through Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusSample {
    /// The metrics, stamped with the scrape's time on the caller's clock (seconds).
    pub metrics: EngineMetrics,
    /// When Prometheus scraped them, in Unix seconds (equal in two reads = the same scrape).
    pub scraped_at_unix_s: f64,
}

/// The PromQL expression sent: every family of [`FAMILIES`] matching `selector` (label
/// matchers without braces; may be empty), over the last [`LOOKBACK_S`] seconds.
pub fn query(selector: &str) -> String {
    let names = FAMILIES.join("|");
    let selector = selector
        .trim()
        .trim_start_matches(',')
        .trim_end_matches(',');
    if selector.is_empty() {
        format!("{{__name__=~\"{names}\"}}[{LOOKBACK_S}s]")
    } else {
        format!("{{__name__=~\"{names}\",{selector}}}[{LOOKBACK_S}s]")
    }
}

/// `s` with every byte except RFC 3986's unreserved characters percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The series of the newest scrape in a `/api/v1/query` answer (result type `matrix`), as
/// exposition text (`name{operator="...",subtask="..."} value` per series, the last sample of
/// each), and that scrape's time in Unix seconds. `None` when no series has a sample.
///
/// # Errors
/// A message when the answer is an error or not a matrix.
pub fn newest_scrape(answer: &serde_json::Value) -> Result<Option<(String, f64)>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "query failed: {} {}",
            answer["errorType"].as_str().unwrap_or("error"),
            answer["error"].as_str().unwrap_or("(no message)")
        ));
    }
    let data = &answer["data"];
    if data["resultType"] != "matrix" {
        return Err(format!(
            "expected a matrix result, got {}",
            data["resultType"]
        ));
    }
    let series = data["result"]
        .as_array()
        .ok_or_else(|| "no result array".to_string())?;
    // (name, labels) -> (time, value) of the last sample.
    let mut last: Vec<(String, BTreeMap<String, String>, f64, String)> = Vec::new();
    for s in series {
        let Some(labels) = s["metric"].as_object() else {
            return Err("a series without labels".into());
        };
        let Some(name) = labels.get("__name__").and_then(|n| n.as_str()) else {
            return Err("a series without __name__".into());
        };
        let Some(point) = s["values"].as_array().and_then(|v| v.last()) else {
            continue;
        };
        let (Some(t), Some(v)) = (point[0].as_f64(), point[1].as_str()) else {
            return Err(format!("{name}: a sample is not [time, \"value\"]"));
        };
        let labels = labels
            .iter()
            .filter(|(k, _)| k.as_str() == "operator" || k.as_str() == "subtask")
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        last.push((name.to_string(), labels, t, v.to_string()));
    }
    let Some(newest) = last.iter().map(|(_, _, t, _)| *t).reduce(f64::max) else {
        return Ok(None);
    };
    let mut text = String::new();
    for (name, labels, t, v) in &last {
        // Series of one target share its scrape's timestamp (ms precision).
        if newest - t > 0.0005 {
            continue;
        }
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(text, "{name}{{{}}} {v}", labels.join(","));
    }
    Ok(Some((text, newest)))
}

/// Reads the engine's metrics from the Prometheus server at `base_url` for the series selected
/// by `selector`. `now_s` is the caller's clock and `now_unix_s` the wall clock, both now, in
/// seconds: the sample is stamped `now_s - (now_unix_s - scrape time)`.
///
/// # Errors
/// [`PrometheusError`].
pub async fn fetch(
    client: &reqwest::Client,
    base_url: &str,
    selector: &str,
    now_s: f64,
    now_unix_s: f64,
) -> Result<PrometheusSample, PrometheusError> {
    let url = format!("{}/api/v1/query", base_url.trim_end_matches('/'));
    let http = |source| PrometheusError::Http {
        url: url.clone(),
        source,
    };
    let response = client
        .get(format!("{url}?query={}", percent_encode(&query(selector))))
        .send()
        .await
        .map_err(http)?;
    let status = response.status();
    let body = response.text().await.map_err(http)?;
    let answer: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| PrometheusError::Answer {
            url: url.clone(),
            message: format!(
                "HTTP {status}: not JSON ({e}): {}",
                body.chars().take(200).collect::<String>()
            ),
        })?;
    let (text, scraped_at) = newest_scrape(&answer)
        .map_err(|message| PrometheusError::Answer {
            url: url.clone(),
            message: format!("HTTP {status}: {message}"),
        })?
        .ok_or_else(|| PrometheusError::Empty {
            url: url.clone(),
            selector: selector.to_string(),
        })?;
    let at = now_s - (now_unix_s - scraped_at).max(0.0);
    let metrics = scrape::parse_metrics(&text, at)?;
    Ok(PrometheusSample {
        metrics,
        scraped_at_unix_s: scraped_at,
    })
}

impl Reading for PrometheusSample {
    fn sample(&self) -> &MetricSample {
        &self.metrics.sample
    }
}

/// The engine's metrics as a Prometheus server scraped them ([`fetch`]), as a
/// [`MetricsSource`].
#[derive(Debug, Clone, Copy)]
pub struct PrometheusSource<'a> {
    /// The client.
    pub client: &'a reqwest::Client,
    /// The server's base URL.
    pub base_url: &'a str,
    /// Label matchers of the engine's series (without braces; may be empty).
    pub selector: &'a str,
}

impl MetricsSource for PrometheusSource<'_> {
    type Reading = PrometheusSample;
    type Error = PrometheusError;

    fn kind(&self) -> &'static str {
        "prometheus"
    }

    /// [`fetch`] with `now_s = clock()` and the wall clock now; never `Ok(None)`.
    async fn collect(
        &mut self,
        clock: &(dyn Fn() -> f64 + Sync),
    ) -> Result<Option<PrometheusSample>, PrometheusError> {
        let now_s = clock();
        let now_unix_s = Timestamp::now().as_millisecond() as f64 / 1000.0;
        fetch(self.client, self.base_url, self.selector, now_s, now_unix_s)
            .await
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_selects_the_planner_families_and_the_job() {
        let q = query("namespace=\"prod\",job=\"tweets-engine\"");
        assert!(
            q.starts_with("{__name__=~\"streamscale_records_in_total|"),
            "{q}"
        );
        assert!(q.contains("streamscale_busy_time_seconds_total"), "{q}");
        assert!(
            q.ends_with(",namespace=\"prod\",job=\"tweets-engine\"}[120s]"),
            "{q}"
        );
        assert!(query(" ").ends_with("\"}[120s]"));
        assert_eq!(
            percent_encode("{a=~\"b|c\"}[1s]"),
            "%7Ba%3D~%22b%7Cc%22%7D%5B1s%5D"
        );
    }

    /// A hand-written `/api/v1/query` answer (a mock of Prometheus' JSON, not a server): an
    /// old engine's series (subtask 1, last scraped earlier) must be dropped.
    #[test]
    fn newest_scrape_keeps_the_latest_target_only() {
        let answer = serde_json::json!({
            "status": "success",
            "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "streamscale_records_in_total", "operator": "work",
                            "subtask": "0", "job": "demo-engine", "instance": "x"},
                 "values": [[100.0, "10"], [101.0, "25"]]},
                {"metric": {"__name__": "streamscale_records_in_total", "operator": "work",
                            "subtask": "1", "job": "demo-engine", "instance": "x"},
                 "values": [[90.0, "7"]]},
                {"metric": {"__name__": "streamscale_busy_time_seconds_total",
                            "operator": "work", "subtask": "0"},
                 "values": [[101.0, "0.5"]]},
            ]}
        });
        let (text, t) = newest_scrape(&answer).unwrap().unwrap();
        assert_eq!(t, 101.0);
        let m = scrape::parse_metrics(&text, 5.0).unwrap();
        assert_eq!(m.parallelism()["work"], 1);
        assert_eq!(m.sample.operators["work"][0].records_in, 25.0);
        assert_eq!(m.sample.operators["work"][0].busy_seconds, 0.5);
    }

    #[test]
    fn errors_and_empty_answers_are_reported() {
        let err = serde_json::json!({"status": "error", "errorType": "bad_data",
                                     "error": "parse error"});
        assert!(newest_scrape(&err).unwrap_err().contains("parse error"));
        let vector = serde_json::json!({"status": "success",
                                        "data": {"resultType": "vector", "result": []}});
        assert!(newest_scrape(&vector).is_err());
        let empty = serde_json::json!({"status": "success",
                                       "data": {"resultType": "matrix", "result": []}});
        assert_eq!(newest_scrape(&empty).unwrap(), None);
    }
}
