//! Load shedding on a real engine process: `POST /v1/shed` makes the sources drop a share of
//! their records, each one counted in `streamscale_records_shed_total` and `recordsShed`, and
//! every source record is either emitted (and then accounted at the sink) or shed.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{EngineProcess, bounded_job, metric_sum};
use serde_json::{Value, json};

const COUNT: u64 = 9_000;

#[test]
fn shed_records_are_counted_and_never_silently_lost() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), COUNT, 3000.0);
    let sps = dir.path().join("savepoints");
    let mut engine = EngineProcess::start(&job, &sps, &["--parallelism", "source=2,work=2"]);
    let client = reqwest::blocking::Client::new();
    let url = format!("{}/v1/shed", engine.base);

    let st: Value = client.get(&url).send().unwrap().json().unwrap();
    assert_eq!(st["share"], 0.0);
    assert_eq!(st["recordsShed"], 0);
    // Out of range: a 400 naming the field, nothing changes.
    let resp = client
        .post(&url)
        .json(&json!({"share": 1.5}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().unwrap().contains("share"));
    // The records emitted before the shed took effect lie between the count read just before
    // the request and the one read just after it (a loaded machine can put seconds between).
    let emitted_before_request = engine.job()["recordsEmitted"].as_u64().unwrap();
    let resp = client
        .post(&url)
        .json(&json!({"share": 0.25}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{}", resp.text().unwrap());
    let emitted_after_request = engine.job()["recordsEmitted"].as_u64().unwrap();

    let done = engine.wait_state("finished", Duration::from_secs(60));
    let st: Value = client.get(&url).send().unwrap().json().unwrap();
    assert_eq!(st["share"], 0.25);
    let shed = st["recordsShed"].as_u64().unwrap();
    let counted = metric_sum(&engine.metrics(), "streamscale_records_shed_total{");
    assert_eq!(counted as u64, shed, "the counter and the REST total agree");
    let emitted = done["recordsEmitted"].as_u64().unwrap();
    assert_eq!(
        emitted + shed,
        COUNT,
        "every source record is emitted or shed: {done}"
    );
    assert_eq!(
        done["recordsAccounted"].as_u64().unwrap(),
        emitted,
        "{done}"
    );
    // About a quarter of the records due after the request were shed (each claimed batch of
    // sequence numbers loses ⌊n/4⌋ or ⌈n/4⌉; the ones emitted before the request are kept):
    // between a quarter of the fewest and of the most that can have been due after it.
    let (fewest, most) = (
        COUNT - emitted_after_request,
        COUNT - emitted_before_request,
    );
    assert!(
        shed as f64 >= 0.2 * fewest as f64 && shed as f64 <= 0.3 * most as f64,
        "shed {shed} of {fewest}..{most} due after the request"
    );
    assert!(shed > 0);
    let (_, job) = engine.stop_with_savepoint(false);
    assert_eq!(job["recordsEmitted"].as_u64().unwrap() + shed, COUNT);
}
