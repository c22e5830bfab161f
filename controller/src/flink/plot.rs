//! A Flink job's `timeline.png`: four stacked panels over the session (the sources' output, the
//! parallelism per vertex, the busy share per vertex against the utilization target, the
//! sources' backlog), each with its key to the right of the plot. Flink has no end-to-end
//! latency histogram, so where `streamscale run`'s chart shows latency this one shows the
//! backlog the sources report (`pendingRecords`).

use std::path::Path;

use plotters::prelude::*;

use super::session::TimelineRow;
use super::topology::VertexRole;
use crate::plot::{
    COLORS, KEY_WIDTH, Panel, PlotError, YAxis, draw_key, line, max_of, panel, step_offset, steps,
};

/// Draws the chart of one job's `rows` (every vertex of every interval, in session order) into
/// the PNG file `path` (1390×1300 pixels), titled with the job's name, with the busy-share
/// panel's target line at `target_utilization` (0–1).
///
/// # Errors
/// [`PlotError::Draw`] when the file or fonts cannot be used.
pub fn plot_job_timeline(
    path: &Path,
    job_name: &str,
    rows: &[TimelineRow],
    target_utilization: f64,
) -> Result<(), PlotError> {
    draw(path, job_name, rows, target_utilization).map_err(|message| PlotError::Draw {
        path: path.display().to_string(),
        message,
    })
}

/// The vertices of `rows` in the order they first appear (Flink's order), with their roles.
fn vertices(rows: &[TimelineRow]) -> Vec<(&str, VertexRole)> {
    let mut out: Vec<(&str, VertexRole)> = Vec::new();
    for r in rows {
        if !out.iter().any(|(v, _)| *v == r.vertex) {
            out.push((&r.vertex, r.role));
        }
    }
    out
}

/// `(t, value)` of `vertex` over the session.
fn series<'a>(
    rows: &'a [TimelineRow],
    vertex: &'a str,
    value: impl Fn(&TimelineRow) -> Option<f64> + 'a,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    rows.iter()
        .filter(move |r| r.vertex == vertex)
        .filter_map(move |r| value(r).map(|v| (r.t_s, v)))
}

/// One line per vertex of `vertices` (its index among the job's vertices, for its colour, and
/// its name) of `value` over the session.
fn vertex_lines(
    chart: &mut Panel<'_>,
    key: &mut Vec<(String, RGBColor)>,
    rows: &[TimelineRow],
    vertices: &[(usize, &str)],
    value: impl Fn(&TimelineRow) -> Option<f64> + Copy,
) -> Result<(), String> {
    for &(i, v) in vertices {
        line(
            chart,
            key,
            series(rows, v, value),
            COLORS[i % COLORS.len()],
            2,
            v,
        )?;
    }
    Ok(())
}

fn draw(
    path: &Path,
    job_name: &str,
    rows: &[TimelineRow],
    target_utilization: f64,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, (1200 + KEY_WIDTH, 1300)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            &format!("Flink job `{job_name}` under streamscale flink"),
            ("sans-serif", 22),
        )
        .map_err(|x| e(&x))?;
    let panels: Vec<_> = root
        .split_evenly((4, 1))
        .into_iter()
        .map(|p| p.split_horizontally(1200))
        .collect();
    let t_max = rows.iter().map(|r| r.t_s).fold(1.0, f64::max);
    let verts = vertices(rows);
    let color = |i: usize| COLORS[i % COLORS.len()];
    let sources: Vec<(usize, &str)> = verts
        .iter()
        .enumerate()
        .filter(|(_, (_, role))| *role == VertexRole::Source)
        .map(|(i, (v, _))| (i, *v))
        .collect();

    // Panel 1: what the sources emit.
    let out_max = max_of(
        rows.iter()
            .filter(|r| r.role == VertexRole::Source)
            .map(|r| r.records_out),
    );
    let mut chart = panel(
        &panels[0].0,
        "records/s out of the sources",
        t_max,
        (out_max * 1.1).max(1.0),
        YAxis::Real,
    )?;
    let mut key = Vec::new();
    vertex_lines(&mut chart, &mut key, rows, &sources, |r| {
        Some(r.records_out)
    })?;
    draw_key(&panels[0].1, &key)?;

    // Panel 2: parallelism per vertex (steps).
    let p_max = rows.iter().map(|r| r.parallelism).max().unwrap_or(1);
    let mut chart = panel(
        &panels[1].0,
        "parallelism per vertex",
        t_max,
        p_max as f64 + 1.0,
        YAxis::Whole,
    )?;
    let mut key = Vec::new();
    for (i, (v, _)) in verts.iter().enumerate() {
        let points = steps(
            series(rows, v, |r| Some(r.parallelism as f64)),
            step_offset(i, verts.len()),
        );
        line(&mut chart, &mut key, points, color(i), 2, v)?;
    }
    draw_key(&panels[1].1, &key)?;

    // Panel 3: busy share per vertex and the utilization target.
    let mut chart = panel(
        &panels[2].0,
        "busy share per vertex (mean of its subtasks)",
        t_max,
        1.05,
        YAxis::Real,
    )?;
    let mut key = Vec::new();
    let all: Vec<(usize, &str)> = verts.iter().map(|(v, _)| *v).enumerate().collect();
    vertex_lines(&mut chart, &mut key, rows, &all, |r| {
        r.busy.is_finite().then_some(r.busy.clamp(0.0, 1.0))
    })?;
    line(
        &mut chart,
        &mut key,
        [(0.0, target_utilization), (t_max, target_utilization)],
        RGBColor(0, 0, 0),
        1,
        "target utilization",
    )?;
    draw_key(&panels[2].1, &key)?;

    // Panel 4: the sources' backlog.
    let reported: Vec<(usize, &str)> = sources
        .iter()
        .copied()
        .filter(|(_, v)| rows.iter().any(|r| r.vertex == *v && r.backlog.is_some()))
        .collect();
    let backlog_max = max_of(rows.iter().filter_map(|r| r.backlog));
    let caption = if reported.is_empty() {
        "source backlog: no source reports pendingRecords"
    } else {
        "source backlog (pendingRecords, records)"
    };
    let mut chart = panel(
        &panels[3].0,
        caption,
        t_max,
        (backlog_max * 1.1).max(1.0),
        YAxis::Real,
    )?;
    let mut key = Vec::new();
    vertex_lines(&mut chart, &mut key, rows, &reported, |r| r.backlog)?;
    draw_key(&panels[3].1, &key)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f64, vertex: &str, role: VertexRole, p: usize, backlog: Option<f64>) -> TimelineRow {
        TimelineRow {
            t_s: t,
            job_id: "0123456789abcdef0123456789abcdef".into(),
            vertex: vertex.into(),
            vertex_id: format!("id-{vertex}"),
            role,
            parallelism: p,
            busy: 0.5,
            records_in: 100.0,
            records_out: 100.0,
            backlog,
        }
    }

    #[test]
    fn vertices_keep_flinks_order() {
        let rows = [
            row(1.0, "src", VertexRole::Source, 1, Some(3.0)),
            row(1.0, "count", VertexRole::Keyed, 1, None),
            row(2.0, "src", VertexRole::Source, 1, Some(4.0)),
            row(2.0, "count", VertexRole::Keyed, 2, None),
        ];
        assert_eq!(
            vertices(&rows),
            vec![("src", VertexRole::Source), ("count", VertexRole::Keyed)]
        );
        let p: Vec<_> = series(&rows, "count", |r| Some(r.parallelism as f64)).collect();
        assert_eq!(p, vec![(1.0, 1.0), (2.0, 2.0)]);
    }

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("timeline.png");
        let rows: Vec<TimelineRow> = (1..=30)
            .flat_map(|i| {
                let t = f64::from(i) * 4.0;
                [
                    row(
                        t,
                        "Source: trace",
                        VertexRole::Source,
                        1,
                        Some(f64::from(i)),
                    ),
                    row(
                        t,
                        "count",
                        VertexRole::Keyed,
                        if i < 15 { 1 } else { 3 },
                        None,
                    ),
                ]
            })
            .collect();
        match plot_job_timeline(&path, "trace-job", &rows, 0.7) {
            Ok(()) => {
                let bytes = std::fs::read(&path).expect("png written");
                assert_eq!(&bytes[1..4], b"PNG");
            }
            // Machines without any font cannot render text; that is not this module's bug.
            Err(e) if e.to_string().to_lowercase().contains("font") => {}
            Err(e) => panic!("{e}"),
        }
    }
}
