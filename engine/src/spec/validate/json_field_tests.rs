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

const SCHEMA: &str = "schema: { name: tweet, fields: { user: string, likes: int, lang: string } }";

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
