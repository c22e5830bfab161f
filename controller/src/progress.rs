//! The live progress lines `streamscale run` prints (pure formatting).

use std::collections::BTreeMap;

use crate::stats::IntervalStats;

/// Utilization from which an operator's ρ is shown next to its parallelism.
pub const SHOW_UTILIZATION_FROM: f64 = 0.25;

/// Busiest-subtask utilization from which it is shown beside the mean ρ (`ρ0.30 max0.98`),
/// when it exceeds the mean by at least [`SHOW_BUSIEST_ABOVE_MEAN_BY`]: uneven load (a hot key)
/// that the mean hides.
pub const SHOW_BUSIEST_FROM: f64 = 0.5;

/// See [`SHOW_BUSIEST_FROM`].
pub const SHOW_BUSIEST_ABOVE_MEAN_BY: f64 = 0.2;

/// Formats a trace time as `+4h12m` (hours may exceed 24); `+0h00m` for times under a minute.
pub fn format_trace_time(seconds: f64) -> String {
    let total_minutes = (seconds.max(0.0) / 60.0).floor() as u64;
    format!("+{}h{:02}m", total_minutes / 60, total_minutes % 60)
}

/// Formats seconds compactly: `0.083s`, `1.25s`, `12.3s`, `125s`.
pub fn format_seconds(seconds: f64) -> String {
    if seconds < 0.1 {
        format!("{seconds:.3}s")
    } else if seconds < 10.0 {
        format!("{seconds:.2}s")
    } else if seconds < 100.0 {
        format!("{seconds:.1}s")
    } else {
        format!("{seconds:.0}s")
    }
}

/// One progress line for an interval, operators in `order` (topological order); the trace
/// time is shown as the offset from `trace_start_s` (the trace's `startSeconds`), e.g.
/// `t=  42s trace=+4h12m in=812 rec/s | source=1 parse=1 enrich=6(ρ0.71) sink=1 | backlog=120 | p99=0.080s (SLO 1.0s)`.
/// A `!` after the p99 marks an SLO violation.
pub fn progress_line(
    stats: &IntervalStats,
    order: &[String],
    slo_s: f64,
    trace_start_s: f64,
) -> String {
    let mut line = format!("t={:>4.0}s", stats.t_s);
    if let Some(tt) = stats.trace_time_s {
        line.push_str(&format!(" trace={}", format_trace_time(tt - trace_start_s)));
    }
    line.push_str(&format!(" in={:.0} rec/s", stats.input_rate));
    if let Some(cap) = stats.capacity {
        line.push_str(&format!(" cap={cap:.0}"));
    }
    line.push_str(" |");
    for op in order {
        let Some(p) = stats.parallelism.get(op) else {
            continue;
        };
        line.push_str(&format!(" {op}={p}"));
        let rho = stats.utilization.get(op).copied();
        let busiest = stats.busiest_utilization.get(op).copied().filter(|b| {
            *b >= SHOW_BUSIEST_FROM && rho.is_some_and(|r| b - r >= SHOW_BUSIEST_ABOVE_MEAN_BY)
        });
        match (rho, busiest) {
            (Some(r), Some(b)) => line.push_str(&format!("(ρ{r:.2} max{b:.2})")),
            (Some(r), None) if r >= SHOW_UTILIZATION_FROM => line.push_str(&format!("(ρ{r:.2})")),
            _ => {}
        }
    }
    if stats.backlog.is_nan() {
        // A source without a backlog metric: unknown, never shown as 0.
        line.push_str(" | backlog=? | p99=");
    } else {
        line.push_str(&format!(" | backlog={:.0} | p99=", stats.backlog));
    }
    let (q, at_q) = stats.slo_latency();
    let mark = |line: &mut String, value: Option<f64>, graded: bool| match value {
        Some(v) => {
            line.push_str(&format_seconds(v));
            if graded && v > slo_s {
                line.push('!');
            }
        }
        None => line.push('-'),
    };
    match stats.slo_percentile {
        None => {
            mark(&mut line, stats.p99_s, true);
            line.push_str(&format!(" (SLO {}s)", slo_label(slo_s)));
        }
        Some(_) => {
            // The SLO is on another percentile: p99 for reference, the graded one beside it.
            mark(&mut line, stats.p99_s, false);
            let label = percentile_label(q);
            line.push_str(&format!(" {label}="));
            mark(&mut line, at_q, true);
            line.push_str(&format!(" (SLO {}s on {label})", slo_label(slo_s)));
        }
    }
    line
}

/// The SLO in seconds as the progress lines print it: one decimal when that is exact (`1.0`,
/// `0.5`), else every digit it needs (`0.02`, `0.005`, `0.25`: a tight SLO must not read as 0.0).
fn slo_label(slo_s: f64) -> String {
    if ((slo_s * 10.0).round() / 10.0 - slo_s).abs() < 1e-12 {
        format!("{slo_s:.1}")
    } else {
        format!("{slo_s}")
    }
}

/// The line printed when the planner first reports the latency SLO unattainable (its reason:
/// the bound at maximum parallelism, and what `autoscaler.onUnattainableSlo` does about it),
/// `None` while it is attainable: `t=  42s SLO UNATTAINABLE: latency SLO 0.02 s unattainable: …`.
pub fn slo_unattainable_line(t_s: f64, decision: &crate::model::Decision) -> Option<String> {
    let reason = unattainable_reason(decision)?;
    Some(format!("t={t_s:>4.0}s SLO UNATTAINABLE: {reason}"))
}

/// The decision's reason saying that the latency SLO is unattainable, if any.
pub fn unattainable_reason(decision: &crate::model::Decision) -> Option<&str> {
    decision
        .reasons
        .iter()
        .find(|r| r.starts_with("latency SLO ") && r.contains(" unattainable"))
        .map(String::as_str)
}

/// The line printed when the planner finds the latency SLO attainable again.
pub fn slo_attainable_line(t_s: f64) -> String {
    format!("t={t_s:>4.0}s SLO ATTAINABLE again: the planner's bound can meet it")
}

/// The name of the `q`-quantile as the run's progress lines, `timeline.csv` columns and the
/// simulator's outputs write it: `p95` for 0.95, `p99.9` for 0.999 (percent, trailing zeros
/// dropped, three decimals, more when three would round a quantile below 1 up to `p100`).
pub fn percentile_label(q: f64) -> String {
    let pct = 100.0 * q;
    if (pct - pct.round()).abs() < 1e-9 {
        return format!("p{pct:.0}");
    }
    let mut decimals = 3;
    let mut text = format!("{pct:.decimals$}");
    while q < 1.0 && text.starts_with("100") && decimals < 12 {
        decimals += 1;
        text = format!("{pct:.decimals$}");
    }
    format!("p{}", text.trim_end_matches('0').trim_end_matches('.'))
}

/// Describes a parallelism change, listing only operators that change:
/// `enrich 4→6, counts 2→3`.
pub fn format_change(
    from: &BTreeMap<String, u32>,
    to: &BTreeMap<String, u32>,
    order: &[String],
) -> String {
    let changes: Vec<String> = order
        .iter()
        .filter_map(|op| {
            let a = from.get(op).copied();
            let b = to.get(op).copied();
            match (a, b) {
                (Some(a), Some(b)) if a != b => Some(format!("{op} {a}→{b}")),
                (None, Some(b)) => Some(format!("{op} ?→{b}")),
                _ => None,
            }
        })
        .collect();
    if changes.is_empty() {
        "no change".to_string()
    } else {
        changes.join(", ")
    }
}

/// The line printed when a rescale starts: `t= 120s RESCALE enrich 4→6 | reason`.
pub fn rescale_started_line(t_s: f64, change: &str, reason: &str) -> String {
    format!("t={t_s:>4.0}s RESCALE {change} | {reason}")
}

/// The line printed when the guards hold back a change the plan wants:
/// `t= 130s HOLD enrich 2→3 | within the utilization band [0.30, 0.80] (…): …`.
pub fn hold_line(t_s: f64, change: &str, reason: &str) -> String {
    format!("t={t_s:>4.0}s HOLD {change} | {reason}")
}

/// The guard a hold's `reason` names, for saying a hold once: its text up to the first `:`
/// (`within the utilization band [#.#, #.#] (…)`, `rescale budget`, `rescale cost`) with
/// every number as `#` (the figures change every interval, also before the `:`, as in
/// `scale-down counts 2→1 waits 8 s for …`).
pub fn hold_kind(reason: &str) -> String {
    let head = reason.split(':').next().unwrap_or(reason);
    let mut kind = String::with_capacity(head.len());
    let mut in_number = false;
    for c in head.chars() {
        let digit = c.is_ascii_digit() || (in_number && c == '.');
        if digit && !in_number {
            kind.push('#');
        } else if !digit {
            kind.push(c);
        }
        in_number = digit;
    }
    kind
}

/// What makes a hold worth saying again: its guard ([`hold_kind`]) and, for each operator the
/// held plan `planned` would move, its name and direction (`+` up, `-` down). The planned
/// values and the reason's figures move every interval; this key moves only when the guard or
/// the set of moves does.
pub fn hold_key(reason: &str, planned: Option<&crate::model::Decision>) -> String {
    let mut key = hold_kind(reason);
    if let Some(d) = planned {
        for (op, p) in &d.parallelism {
            if let Some(cur) = d.current.get(op.as_str()).filter(|c| *c != p) {
                key.push('|');
                key.push_str(op);
                key.push(if p > cur { '+' } else { '-' });
            }
        }
    }
    key
}

/// The hold last said ([`hold_key`]) and when it said it would act, if it named a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HoldSaid {
    key: String,
    due_s: Option<f64>,
}

impl HoldSaid {
    /// Whether a hold with `key`, expecting to act at `due_s` (seconds on the caller's clock),
    /// is worth saying after the one said last: another guard or set of moves, or the time it
    /// named moved later by more than `slack_s` (the wait it announced grew). Remembers it
    /// when it is.
    pub fn news(&mut self, key: String, due_s: Option<f64>, slack_s: f64) -> bool {
        let later = match (self.due_s, due_s) {
            (Some(said), Some(now)) => now > said + slack_s,
            (None, Some(_)) => true,
            _ => false,
        };
        if key != self.key || later {
            *self = HoldSaid { key, due_s };
            true
        } else {
            false
        }
    }

    /// Forgets the hold (a rescale or no hold came in between).
    pub fn clear(&mut self) {
        *self = HoldSaid::default();
    }
}

/// The line printed with `--no-autoscale` when the planner decides a rescale the run does not
/// apply: `t= 123s WOULD RESCALE enrich 4→6 (--no-autoscale) | reason`.
pub fn rescale_recommended_line(t_s: f64, change: &str, reason: &str) -> String {
    format!("t={t_s:>4.0}s WOULD RESCALE {change} (--no-autoscale) | {reason}")
}

/// Operators the plan `decision` holds although they cannot take their load there, by name;
/// empty when every operator can keep up. Two kinds: held at their largest parallelism with
/// predicted utilization ρ = λ / (p · μ) above 1; and operators `learned` flagged for
/// ineffective scaling (a scale-up did not raise the rate their busiest subtask can carry,
/// e.g. one hot key) whose λ exceeds that capacity. Either way their input queue and the
/// sources' backlog grow. Also keyed operators the plan reports as a hot-key bottleneck (one
/// key group needs more than a subtask at the target utilization, from the engine's
/// `streamscale_key_group_share`): held at the parallelism that isolates that group, since
/// more subtasks cannot take its load off its subtask.
pub fn overloaded_held(
    decision: &crate::model::Decision,
    learned: &crate::model::learn::ScalabilityTracker,
) -> Vec<String> {
    decision
        .operators
        .iter()
        .filter(|(name, o)| {
            let at_max = o.parallelism >= o.max_parallelism
                && o.predicted_utilization.is_some_and(|rho| rho > 1.0);
            at_max
                || held_by_flag(name, o, learned).is_some()
                || hot_key_reason(name, decision).is_some()
        })
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The planner's hot-key bottleneck reason for operator `name` without the `NAME: ` prefix
/// (`hot-key bottleneck: one key group takes 100.0% of 800 rec/s, …`), if it gave one.
fn hot_key_reason<'a>(name: &str, decision: &'a crate::model::Decision) -> Option<&'a str> {
    decision.reasons.iter().find_map(|r| {
        r.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(": "))
            .filter(|rest| rest.starts_with("hot-key bottleneck"))
    })
}

/// The ineffective-scaling flag of operator `name` when it holds the operator below the load
/// `o` plans for: at or under the flagged parallelism, with λ above the capacity measured
/// after the scale-up ([`crate::model::learn::Ineffective::capacity_after`]).
fn held_by_flag<'a>(
    name: &str,
    o: &crate::model::OperatorPlan,
    learned: &'a crate::model::learn::ScalabilityTracker,
) -> Option<&'a crate::model::learn::Ineffective> {
    learned.ineffective.get(name).filter(|flag| {
        o.parallelism <= flag.to
            && flag.capacity_after > 0.0
            && o.arrival_rate > flag.capacity_after
    })
}

/// Whether an operator of kind `kind` (the plan's [`crate::model::OperatorPlan::kind`]) is
/// partitioned by key group (`OperatorKind::is_keyed` in the engine): only such an operator
/// can be held back by a hot key.
fn keyed_kind(kind: &str) -> bool {
    matches!(kind, "window" | "eventWindow" | "windowTop" | "join")
}

/// The line printed when operators ([`overloaded_held`]) start being held although they
/// cannot take their load: `t=  42s AT LIMIT lookup=1 (its max): λ 400 rec/s > 1 × μ 195 rec/s
/// (ρ 2.05), falls behind by ~205 rec/s; holding there (…)`, or for an operator flagged for
/// ineffective scaling `counts=3 (more subtasks did not help: its busiest subtask takes 100%
/// of the input, a hot key?): λ 800 rec/s > 468 rec/s it can carry, falls behind by ~332
/// rec/s`; `None` for no operator. With `applied` false (`--no-autoscale`: the job keeps its
/// file's parallelism, the plan is only recommended) the line ends `would hold there
/// (--no-autoscale keeps the job's parallelism; …)` instead: nothing is held there.
pub fn at_limit_line(
    t_s: f64,
    decision: &crate::model::Decision,
    learned: &crate::model::learn::ScalabilityTracker,
    names: &[String],
    applied: bool,
) -> Option<String> {
    use crate::model::planner::fmt_rate;
    let (mut at_max, mut stuck, mut flat) = (false, false, false);
    let parts: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let o = decision.operators.get(name.as_str())?;
            if let Some(reason) = hot_key_reason(name, decision) {
                stuck = true;
                // (The line ends in "holding there": the reason's own "holds there" would say
                // it twice.)
                let reason = reason.strip_suffix(", holds there").unwrap_or(reason);
                return Some(format!("{name}={} ({reason})", o.parallelism));
            }
            if let Some(flag) = held_by_flag(name, o, learned)
                && !keyed_kind(&o.kind)
            {
                // No key groups: capacity that stopped growing is sub-linear scaling (a
                // shared CPU, an external system), not a hot key.
                flat = true;
                return Some(format!(
                    "{name}={} (more subtasks did not help: {} rec/s at p={} vs {} rec/s at p={}, sub-linear scaling): λ {} rec/s > {} rec/s it can carry, falls behind by ~{} rec/s",
                    o.parallelism,
                    fmt_rate(flag.capacity_after),
                    flag.to,
                    fmt_rate(flag.capacity_before),
                    flag.from,
                    fmt_rate(o.arrival_rate),
                    fmt_rate(flag.capacity_after),
                    fmt_rate((o.arrival_rate - flag.capacity_after).max(0.0)),
                ));
            }
            if let Some(flag) = held_by_flag(name, o, learned) {
                stuck = true;
                let share = (flag.mu / flag.capacity_after).min(1.0);
                return Some(format!(
                    "{name}={} (more subtasks did not help: its busiest subtask takes {:.0}% of the input{}): λ {} rec/s > {} rec/s it can carry, falls behind by ~{} rec/s",
                    o.parallelism,
                    100.0 * share,
                    if share > 0.9 { ", a hot key?" } else { "" },
                    fmt_rate(o.arrival_rate),
                    fmt_rate(flag.capacity_after),
                    fmt_rate((o.arrival_rate - flag.capacity_after).max(0.0)),
                ));
            }
            let mu = o.true_processing_rate?;
            let rho = o.predicted_utilization?;
            let capacity = f64::from(o.parallelism) * mu;
            at_max = true;
            Some(format!(
                "{name}={} (its max): λ {} rec/s > {} × μ {} rec/s (ρ {rho:.2}), falls behind by ~{} rec/s",
                o.parallelism,
                fmt_rate(o.arrival_rate),
                o.parallelism,
                fmt_rate(mu),
                fmt_rate((o.arrival_rate - capacity).max(0.0)),
            ))
        })
        .collect();
    let mut advice = Vec::new();
    if !applied {
        advice.push("--no-autoscale keeps the job's parallelism");
    }
    if at_max {
        advice.push("raise scaling.max or maxParallelism, or set autoscaler.limits.onLimit: shed");
    }
    if stuck {
        advice.push("spread the hot keys or speed up the operator");
    }
    if flat {
        advice.push(
            "more subtasks do not raise its capacity: give it more CPU, or speed up the operator or what it waits on",
        );
    }
    (!parts.is_empty()).then(|| {
        format!(
            "t={t_s:>4.0}s AT LIMIT {}; {} there ({})",
            parts.join("; "),
            if applied { "holding" } else { "would hold" },
            advice.join("; ")
        )
    })
}

/// The line printed when a job whose sources have a record `count` finished: `t=   4s job
/// finished: …`, its `t=` column as wide as the other lines'.
pub fn job_finished_line(t_s: f64) -> String {
    format!(
        "t={t_s:>4.0}s job finished: the sources reached their record count and the graph drained"
    )
}

/// The line printed when load shedding changes: `t=  42s SHED 12.5% of source records: why`
/// (`percent` in 0..=100).
pub fn shed_line(t_s: f64, percent: f64, why: &str) -> String {
    format!("t={t_s:>4.0}s SHED {percent:.1}% of source records: {why}")
}

/// The line printed when no operator is held overloaded at its limit any more.
pub fn within_limits_line(t_s: f64) -> String {
    format!("t={t_s:>4.0}s WITHIN LIMITS again: every operator can take its load")
}

/// The line printed when a rescale finished: `t= 123s RESCALED enrich 4→6: downtime 2.31s`.
pub fn rescale_done_line(t_s: f64, change: &str, downtime_s: f64) -> String {
    format!(
        "t={t_s:>4.0}s RESCALED {change}: downtime {}",
        format_seconds(downtime_s)
    )
}

/// The line printed when a rescale failed and the job continues at the old parallelism.
pub fn rescale_failed_line(
    t_s: f64,
    change: &str,
    what: &str,
    error: &str,
    downtime_s: f64,
) -> String {
    format!(
        "t={t_s:>4.0}s RESCALE FAILED ({what}) {change}: {error}; continuing at the old parallelism (downtime {})",
        format_seconds(downtime_s)
    )
}

/// The line after a failed rescale: `t=  12s BACKOFF enrich 4→6 failed (2 in a row): no rescale
/// for 20 s` (the wait doubles with each failure in a row, see
/// [`crate::rescale::RescaleBackoff`]).
pub fn rescale_backoff_line(t_s: f64, change: &str, failures: u32, wait_s: f64) -> String {
    format!(
        "t={t_s:>4.0}s BACKOFF {change} failed ({failures} in a row): no rescale for {} (doubling with each failure, at most {})",
        format_seconds(wait_s),
        format_seconds(crate::rescale::BACKOFF_MAX_S)
    )
}

/// The line when the planner wants a rescale during a backoff, said once per wait:
/// `t=  15s RESCALE HELD enrich 4→6: this parallelism failed to start 2 time(s) (2 failures in a
/// row); next attempt in 8 s`.
pub fn rescale_backoff_hold_line(
    t_s: f64,
    change: &str,
    failures_here: u32,
    failures: u32,
    left_s: f64,
) -> String {
    let which = if failures_here > 0 {
        format!("this parallelism failed {failures_here} time(s)")
    } else {
        "another parallelism failed".to_string()
    };
    format!(
        "t={t_s:>4.0}s RESCALE HELD {change}: {which} ({failures} failure(s) in a row); backing off, next attempt in {}",
        format_seconds(left_s)
    )
}

/// The warning when subtasks are missing from a scrape (`missing`: operator and indices, from
/// [`crate::model::MetricSample::mark_missing`]), `None` when none is (any more: then the
/// line says the metrics are complete again). `parallelism`: what the engine runs.
pub fn missing_subtasks_line(
    t_s: f64,
    missing: &[(String, Vec<usize>)],
    parallelism: &BTreeMap<String, u32>,
) -> Option<String> {
    if missing.is_empty() {
        return Some(format!(
            "warning: t={t_s:.0}s every subtask reports its metrics again"
        ));
    }
    let list: Vec<String> = missing
        .iter()
        .map(|(op, ks)| {
            let ks: Vec<String> = ks.iter().map(usize::to_string).collect();
            format!(
                "{op} subtask {} of {}",
                ks.join(", "),
                parallelism.get(op).map_or(ks.len() as u32, |p| *p)
            )
        })
        .collect();
    Some(format!(
        "warning: t={t_s:.0}s metrics missing from the scrape: {}; incomplete samples are left out of the plan and the progress lines (the operators still run their subtasks)",
        list.join("; ")
    ))
}

/// The warning, said once per source, when a source exports no backlog metric.
pub fn no_backlog_metric_line(source: &str) -> String {
    format!(
        "warning: source `{source}` exports no {}: its backlog is unknown (backlog=? on the progress lines, null in summary.json, never 0); the planner sizes from its arrival rate and makes no scale-down while the backlog is unknown",
        crate::scrape::SOURCE_BACKLOG
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_keyed_by_its_guard_not_its_figures() {
        let band = "within the utilization band [0.30, 0.80] (autoscaler.minUtilization, autoscaler.maxUtilization): enrich: scale-up 6→7 held: ρ 0.80 at 6";
        assert_eq!(
            hold_kind(band),
            "within the utilization band [#, #] (autoscaler.minUtilization, autoscaler.maxUtilization)"
        );
        // A count-down before the `:` is one hold, not one a second.
        let wait = |s: u32| {
            format!(
                "scale-down counts 2→1 waits {s} s for enrich's scale-down 6→2: one rescale instead of two"
            )
        };
        assert_eq!(hold_kind(&wait(8)), hold_kind(&wait(17)));
        assert_eq!(
            hold_kind(&wait(8)),
            "scale-down counts #→# waits # s for enrich's scale-down #→#"
        );
        assert_eq!(
            hold_kind("rescale budget: 2 rescales in the last hour"),
            hold_kind("rescale budget: 3 rescales in the last hour")
        );
        assert_eq!(hold_kind("no colon"), "no colon");
        assert_eq!(
            hold_line(55.2, "enrich 6→7", band),
            format!("t=  55s HOLD enrich 6→7 | {band}")
        );
    }

    #[test]
    fn a_hold_is_said_again_when_the_wait_it_named_grows() {
        let mut said = HoldSaid::default();
        let key = || "scale-down counts #→# waits # s for enrich's scale-down #→#".to_string();
        assert!(said.news(key(), Some(108.0), 1.0), "first time");
        // The count-down runs: nothing new.
        assert!(!said.news(key(), Some(108.0), 1.0));
        assert!(!said.news(key(), Some(108.9), 1.0), "within the slack");
        // The awaited scale-down became due later (its lookback was refreshed): said again,
        // and then the new time is the one to beat.
        assert!(said.news(key(), Some(126.0), 1.0));
        assert!(!said.news(key(), Some(126.0), 1.0));
        // Sooner is no news; another guard is.
        assert!(!said.news(key(), Some(120.0), 1.0));
        assert!(said.news("rescale budget".to_string(), None, 1.0));
        assert!(!said.news("rescale budget".to_string(), None, 1.0));
        said.clear();
        assert!(
            said.news("rescale budget".to_string(), None, 1.0),
            "after a clear"
        );
    }

    #[test]
    fn missing_subtasks_are_named_with_the_parallelism_the_operator_runs() {
        let p: BTreeMap<String, u32> = [("src".to_string(), 2)].into_iter().collect();
        let line = missing_subtasks_line(7.0, &[("src".to_string(), vec![1])], &p).expect("a line");
        assert!(
            line.contains("src subtask 1 of 2") && line.contains("left out of the plan"),
            "{line}"
        );
        let again = missing_subtasks_line(9.0, &[], &p).expect("a line");
        assert!(again.contains("again"), "{again}");
        assert!(no_backlog_metric_line("src").contains("never 0"));
    }

    fn order() -> Vec<String> {
        ["source", "parse", "enrich", "counts", "sink"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn formats_a_progress_line() {
        let stats = IntervalStats {
            t_s: 42.2,
            dt_s: 1.0,
            trace_time_s: Some(1000.0 + 4.0 * 3600.0 + 12.0 * 60.0 + 30.0),
            input_rate: 812.4,
            target_rate: 800.0,
            capacity: None,
            parallelism: [
                ("source", 1),
                ("parse", 1),
                ("enrich", 6),
                ("counts", 2),
                ("sink", 1),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
            utilization: [("parse", 0.1), ("enrich", 0.712), ("counts", 0.4)]
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            backlog: 120.0,
            p99_s: Some(0.08),
            ..IntervalStats::default()
        };
        assert_eq!(
            progress_line(&stats, &order(), 1.0, 1000.0),
            "t=  42s trace=+4h12m in=812 rec/s | source=1 parse=1 enrich=6(ρ0.71) counts=2(ρ0.40) sink=1 | backlog=120 | p99=0.080s (SLO 1.0s)"
        );
    }

    #[test]
    fn shows_the_busiest_subtask_only_when_the_mean_hides_it() {
        let stats = IntervalStats {
            parallelism: [("enrich", 4), ("counts", 4), ("parse", 2)]
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            utilization: [("enrich", 0.3), ("counts", 0.6), ("parse", 0.1)]
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            // enrich: a hot key (one subtask saturated, mean 0.30); counts: an even spread;
            // parse: uneven but nowhere busy.
            busiest_utilization: [("enrich", 0.99), ("counts", 0.65), ("parse", 0.4)]
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            ..IntervalStats::default()
        };
        let line = progress_line(&stats, &order(), 1.0, 0.0);
        assert!(
            line.contains("| parse=2 enrich=4(ρ0.30 max0.99) counts=4(ρ0.60) |"),
            "{line}"
        );
    }

    #[test]
    fn a_hot_key_bottleneck_is_an_at_limit_line() {
        let plan = |p: u32| {
            serde_json::json!({
                "kind": "window", "currentParallelism": p, "parallelism": p,
                "maxParallelism": 128, "observedInputRate": 800.0, "arrivalRate": 800.0,
                "steadyArrivalRate": 800.0, "trueProcessingRate": 470.0, "selectivity": 1.0,
                "selectivityIsPrior": false, "observedUtilization": 0.5,
                "backpressuredShare": 0.0, "predictedUtilization": 0.85,
                "predictedSojournSeconds": 0.01, "clampedAtMax": false, "reason": "",
            })
        };
        let decision: crate::model::Decision = serde_json::from_value(serde_json::json!({
            "parallelism": { "counts": 2, "counts2": 2 }, "current": { "counts": 2, "counts2": 2 },
            "operators": { "counts": plan(2), "counts2": plan(2) }, "sources": {},
            "predictedLatencySeconds": 0.1, "criticalPath": [], "latencySloSeconds": 1.0,
            "targetUtilization": 0.7,
            "reasons": ["counts: hot-key bottleneck: key group 7 takes 100.0% of 800 rec/s (800 rec/s), more than one subtask's 329.0 rec/s at ρ 0.70; more parallelism cannot bring it under the target: p=2 isolates it (its subtask carries 0.0% of the input besides it, every other subtask within the target), holds there"],
        }))
        .expect("decision");
        let learned = crate::model::learn::ScalabilityTracker::default();
        // Only the operator the reason names (not one whose name it begins with).
        let held = overloaded_held(&decision, &learned);
        assert_eq!(held, vec!["counts".to_string()]);
        let line = at_limit_line(12.0, &decision, &learned, &held, true).expect("a line");
        assert_eq!(
            line,
            "t=  12s AT LIMIT counts=2 (hot-key bottleneck: key group 7 takes 100.0% of 800 rec/s (800 rec/s), more than one subtask's 329.0 rec/s at ρ 0.70; more parallelism cannot bring it under the target: p=2 isolates it (its subtask carries 0.0% of the input besides it, every other subtask within the target)); holding there (spread the hot keys or speed up the operator)"
        );
        // Under --no-autoscale the job keeps its file's parallelism: nothing is held at the
        // plan's p (the old line said `holding there` of a p the job never ran at).
        let line = at_limit_line(12.0, &decision, &learned, &held, false).expect("a line");
        assert!(
            line.ends_with("; would hold there (--no-autoscale keeps the job's parallelism; spread the hot keys or speed up the operator)"),
            "{line}"
        );
        assert!(!line.contains("holding"), "{line}");
    }

    /// Issue 22 case 7: a non-keyed map whose capacity stopped growing (shared CPU) is not
    /// blamed on hot keys.
    #[test]
    fn a_flagged_map_is_not_blamed_on_hot_keys() {
        let decision: crate::model::Decision = serde_json::from_value(serde_json::json!({
            "parallelism": { "map": 1 }, "current": { "map": 1 },
            "operators": { "map": {
                "kind": "map", "currentParallelism": 1, "parallelism": 1,
                "maxParallelism": 128, "observedInputRate": 200.0, "arrivalRate": 450.0,
                "steadyArrivalRate": 450.0, "trueProcessingRate": 200.0, "selectivity": 1.0,
                "selectivityIsPrior": false, "observedUtilization": 1.0,
                "backpressuredShare": 0.0, "predictedUtilization": 2.25,
                "predictedSojournSeconds": 0.01, "clampedAtMax": false, "reason": "",
            } }, "sources": {},
            "predictedLatencySeconds": 0.1, "criticalPath": [], "latencySloSeconds": 1.0,
            "targetUtilization": 0.7, "reasons": [],
        }))
        .expect("decision");
        let mut learned = crate::model::learn::ScalabilityTracker::default();
        learned.ineffective.insert(
            "map".to_string(),
            crate::model::learn::Ineffective {
                from: 1,
                to: 3,
                capacity_before: 200.0,
                capacity_after: 205.0,
                mu: 200.0,
                input_rate: 200.0,
            },
        );
        let held = overloaded_held(&decision, &learned);
        let line = at_limit_line(12.0, &decision, &learned, &held, true).expect("a line");
        assert!(!line.contains("hot key"), "{line}");
        assert!(
            line.contains("more subtasks do not raise its capacity"),
            "{line}"
        );
    }

    #[test]
    fn marks_slo_violations_and_missing_p99() {
        let mut stats = IntervalStats {
            t_s: 5.0,
            p99_s: Some(1.5),
            capacity: Some(950.0),
            ..IntervalStats::default()
        };
        let line = progress_line(&stats, &order(), 1.0, 0.0);
        assert!(line.contains("p99=1.50s! (SLO 1.0s)"), "{line}");
        assert!(line.contains("cap=950"), "{line}");
        assert!(!line.contains("trace="), "{line}");
        stats.p99_s = None;
        assert!(progress_line(&stats, &order(), 1.0, 0.0).contains("p99=- "));
    }

    #[test]
    fn a_tight_slo_is_printed_with_its_digits() {
        let stats = IntervalStats {
            t_s: 5.0,
            p99_s: Some(0.048),
            ..IntervalStats::default()
        };
        let line = progress_line(&stats, &order(), 0.02, 0.0);
        assert!(line.ends_with("p99=0.048s! (SLO 0.02s)"), "{line}");
        assert_eq!(slo_label(1.0), "1.0");
        assert_eq!(slo_label(0.5), "0.5");
        assert_eq!(slo_label(0.005), "0.005");
        assert_eq!(slo_label(0.25), "0.25");
    }

    /// A real plan (map μ 100 rec/s, an SLO of 5 ms below its service time): the unattainable
    /// SLO gets its own line and is named in the rescale's reason; an attainable one neither.
    #[test]
    fn an_unattainable_slo_has_a_line_and_a_place_in_the_rescale_reason() {
        use crate::model::testutil::{Synth, job, window};
        use streamscale_engine::spec::UnattainableSlo;
        let mut spec = job(
            "name: chain\noperators:\n  - { name: src, kind: source, rate: { constant: 100 } }\n  - { name: map, kind: map, parallelism: 1 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: map }\n  - { from: map, to: sink }\n",
        );
        spec.autoscaler.on_unattainable_slo = UnattainableSlo::BestEffort;
        let w = window(
            &[
                Synth::source("src", 1, 180.0, 0.0),
                Synth::op("map", 1, 180.0, 100.0, 1.0),
                Synth::op("sink", 1, 180.0, 10_000.0, 0.0),
            ],
            &[0.0, 5.0, 10.0],
        );
        let settings = |slo: f64| crate::model::PlannerSettings {
            latency_slo_seconds: Some(slo),
            ..crate::model::PlannerSettings::default()
        };
        let d = crate::model::plan(&spec, &w, &settings(0.005)).expect("plans");
        assert!(d.parallelism["map"] > 1, "{d:?}");
        let line = slo_unattainable_line(42.0, &d).expect("a line");
        assert!(
            line.starts_with("t=  42s SLO UNATTAINABLE: latency SLO 0.005 s unattainable: even at maximum parallelism the p99 bound is ")
                && line.contains("best effort (onUnattainableSlo: bestEffort): the latency allocation aims at"),
            "{line}"
        );
        let reason = crate::run::rescale_reason(&d);
        assert!(reason.starts_with("map: "), "{reason}");
        assert!(
            reason.contains("; latency SLO 0.005 s unattainable: "),
            "{reason}"
        );
        let d = crate::model::plan(&spec, &w, &settings(1.0)).expect("plans");
        assert!(slo_unattainable_line(42.0, &d).is_none(), "{:?}", d.reasons);
        assert!(!crate::run::rescale_reason(&d).contains("unattainable"));
    }

    #[test]
    fn grades_the_slo_on_its_own_percentile() {
        let mut stats = IntervalStats {
            t_s: 5.0,
            p99_s: Some(1.5),
            slo_percentile: Some(0.95),
            slo_latency_s: Some(0.4),
            ..IntervalStats::default()
        };
        // p99 above the SLO, p95 under it: no violation mark.
        let line = progress_line(&stats, &order(), 1.0, 0.0);
        assert!(
            line.ends_with("p99=1.50s p95=0.40s (SLO 1.0s on p95)"),
            "{line}"
        );
        stats.slo_latency_s = Some(1.2);
        let line = progress_line(&stats, &order(), 1.0, 0.0);
        assert!(line.ends_with("p95=1.20s! (SLO 1.0s on p95)"), "{line}");
        assert_eq!(percentile_label(0.999), "p99.9");
        assert_eq!(percentile_label(0.999_999_999), "p99.9999999");
        assert_eq!(percentile_label(0.999_999), "p99.9999");
        assert_eq!(percentile_label(0.5), "p50");
    }

    #[test]
    fn formats_changes_and_times() {
        let from = [("enrich", 4), ("counts", 2), ("sink", 1)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let to = [("enrich", 6), ("counts", 3), ("sink", 1)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        assert_eq!(
            format_change(&from, &to, &order()),
            "enrich 4→6, counts 2→3"
        );
        assert_eq!(format_change(&from, &from, &order()), "no change");
        assert_eq!(format_trace_time(59.0), "+0h00m");
        assert_eq!(format_trace_time(26.0 * 3600.0 + 5.0 * 60.0), "+26h05m");
        assert_eq!(format_seconds(2.314), "2.31s");
        assert_eq!(
            rescale_done_line(123.0, "enrich 4→6", 2.314),
            "t= 123s RESCALED enrich 4→6: downtime 2.31s"
        );
    }

    #[test]
    fn every_timed_line_has_the_same_t_column() {
        // The job-finished and SHED lines were written `t={:>3.0}s` (`t=  4s job finished`
        // under `t=   4s in=…`), the others `t={:>4.0}s`.
        let width = |l: &str| l.find('s').expect("t=…s");
        let reference = width(&within_limits_line(4.0));
        assert_eq!(reference, width("t=   4s"));
        for t in [4.0, 42.0, 123.0] {
            assert_eq!(width(&job_finished_line(t)), reference);
            assert_eq!(width(&shed_line(t, 12.5, "why")), reference);
        }
        assert_eq!(
            shed_line(42.0, 12.5, "why"),
            "t=  42s SHED 12.5% of source records: why"
        );
        assert!(job_finished_line(4.0).starts_with("t=   4s job finished: "));
    }
}
