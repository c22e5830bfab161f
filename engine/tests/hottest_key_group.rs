//! `streamscale_hottest_key_group_share`: a keyed subtask's busiest key group's share of its
//! recent records, read from the real engine's `/metrics`. One key puts every record of the
//! keyed operator into one key group of one subtask (≈ 1 there, absent on the subtask that gets
//! none); many keys spread over the subtask's 64 key groups (about 1/64 each); a non-keyed
//! operator has no such series.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{EngineProcess, metric_sum};

/// `streamscale_hottest_key_group_share` of `operator`'s subtask `subtask`, if published.
fn share(text: &str, operator: &str, subtask: u32) -> Option<f64> {
    let series = format!(
        "streamscale_hottest_key_group_share{{operator=\"{operator}\",subtask=\"{subtask}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.trim().parse().unwrap())
}

/// The `streamscale_key_group_share` series of `operator`'s subtask `subtask`: (key group,
/// share), in page order.
fn listed(text: &str, operator: &str, subtask: u32) -> Vec<(u32, f64)> {
    let prefix = format!(
        "streamscale_key_group_share{{operator=\"{operator}\",subtask=\"{subtask}\",key_group=\""
    );
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (group, value) = rest.split_once("\"} ").unwrap();
            (group.parse().unwrap(), value.trim().parse().unwrap())
        })
        .collect()
}

/// Runs a source with `keys` keys at 2000 records/s through a map into a keyed window at
/// parallelism 2 (128 key groups, 64 per subtask) for 1.5 s, and on until the window has taken
/// `min_records` records (a loaded machine can lag behind the source's rate), and returns
/// `/metrics`.
fn metrics_with_keys(keys: u64, min_records: f64) -> String {
    let yaml = format!(
        "name: keys\nmaxParallelism: 128\noperators:\n  - {{ name: src, kind: source, keys: {keys}, rate: {{ constant: 2000 }} }}\n  - {{ name: map, kind: map }}\n  - {{ name: counts, kind: window, sizeMs: 1000, parallelism: 2 }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: map }}\n  - {{ from: map, to: counts }}\n  - {{ from: counts, to: sink }}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, yaml).unwrap();
    let engine = EngineProcess::start(&job, &dir.path().join("savepoints"), &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let m = engine.metrics();
        let taken = metric_sum(&m, "streamscale_records_in_total{operator=\"counts\"");
        // The share is set just after the flush adds to the record counter: wait for both.
        // The hottest share and the busiest groups' list are published one after the other,
        // so a scrape between the two can pair one flush's share with another's list: wait
        // for a page whose lists lie within their subtask's share.
        let paired = (0..2).all(|i| {
            share(&m, "counts", i)
                .is_none_or(|h| listed(&m, "counts", i).iter().all(|&(_, s)| s <= h))
        });
        if taken >= min_records
            && paired
            && share(&m, "counts", 0).or(share(&m, "counts", 1)).is_some()
        {
            return m;
        }
        assert!(
            Instant::now() < until,
            "in 120 s the window took {taken} records (awaited {min_records}) or published no share:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn one_key_gives_its_subtask_a_share_of_one() {
    let m = metrics_with_keys(1, 100.0);
    let shares = [share(&m, "counts", 0), share(&m, "counts", 1)];
    // The one key's group belongs to one subtask: that one reads 1, the other has had no
    // record and publishes nothing.
    let published: Vec<f64> = shares.iter().flatten().copied().collect();
    assert_eq!(published.len(), 1, "{shares:?}\n{m}");
    assert!((published[0] - 1.0).abs() < 1e-9, "{shares:?}");
    assert_eq!(share(&m, "map", 0), None, "non-keyed operator:\n{m}");
    // The list names the one key's group (key 0 hashes to group 0, subtask 0's range) at 1.
    let group = streamscale_engine::keygroup::key_group(0, 128);
    let subtask = u32::from(group >= 64);
    assert_eq!(listed(&m, "counts", subtask), vec![(group, 1.0)], "{m}");
    assert!(listed(&m, "counts", 1 - subtask).is_empty(), "{m}");
    assert!(listed(&m, "map", 0).is_empty(), "{m}");
    assert_eq!(share(&m, "src", 0), None, "source:\n{m}");
}

#[test]
fn many_keys_give_a_small_share() {
    let m = metrics_with_keys(100_000, 2000.0);
    for i in 0..2 {
        let h = share(&m, "counts", i).unwrap_or_else(|| panic!("no share for counts-{i}:\n{m}"));
        // Even spread: 1/64 per key group; ~1500 records per subtask make the busiest one
        // a few times that at most.
        assert!(h > 1.0 / 64.0 - 1e-9 && h < 0.1, "counts-{i}: {h}");
        // The 8 busiest of the subtask's 64 groups, all in its range, the first at h.
        let l = listed(&m, "counts", i);
        assert_eq!(l.len(), 8, "counts-{i}: {l:?}");
        assert!(
            l.iter().all(|&(g, s)| g / 64 == i && s > 0.0 && s <= h),
            "{l:?}"
        );
        assert!(l.iter().any(|&(_, s)| s == h), "{l:?}");
    }
}
