//! The checked-in CRDs (`crds/streamjob.yaml`, `crds/flinkscaler.yaml` and the chart's copies)
//! must match the Rust types.

use std::path::PathBuf;

#[test]
fn checked_in_crd_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let jobs = streamscale_operator::crd::crd_yaml();
    let scalers = streamscale_operator::flink_scaler_crd::crd_yaml();
    for (rel, want) in [
        ("crds/streamjob.yaml", &jobs),
        ("charts/streamscale/crds/streamjob.yaml", &jobs),
        ("crds/flinkscaler.yaml", &scalers),
        ("charts/streamscale/crds/flinkscaler.yaml", &scalers),
    ] {
        let have = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
        assert!(
            &have == want,
            "{rel} is stale: regenerate with `cargo run -p streamscale-operator --bin crdgen -- crds charts/streamscale/crds`"
        );
    }
}

#[test]
fn crd_has_validation_and_printer_columns() {
    let yaml = streamscale_operator::crd::crd_yaml();
    for needle in [
        "x-kubernetes-validations",
        "self.min <= self.max",
        "additionalPrinterColumns",
        ".status.lastDecision.bottleneck",
        "shortNames",
        "- sj",
        "- recommend",
    ] {
        assert!(yaml.contains(needle), "CRD lacks {needle}");
    }
    assert!(
        !yaml.contains("oneOf:\n                          - properties"),
        "non-structural oneOf left"
    );
}

/// A default on one operator kind's field (e.g. a source's `keys`) would be applied by the API
/// server to operators of every kind, and the stored StreamJob would no longer deserialize.
#[test]
fn operator_kind_fields_have_no_schema_defaults() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(streamscale_operator::crd::StreamJob::crd()).expect("json");
    let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["job"]["properties"]["operators"]["items"]["properties"];
    assert!(props.is_object(), "no operator properties in the CRD");
    for field in ["keys", "count", "rate", "keep", "sizeMs", "output"] {
        if let Some(p) = props.get(field) {
            assert!(p.get("default").is_none(), "{field} has a default: {p}");
        }
    }
    // And a job with a sink and a map, defaulted as the API server would, deserializes.
    let job: streamscale_operator::crd::StreamJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": "x"},
        "spec": {"job": {
            "name": "x",
            "operators": [
                {"name": "s", "kind": "source", "rate": {"constant": 1}, "cpu": 0.0, "io": 0.0, "parallelism": 1},
                {"name": "m", "kind": "map", "cpu": 0.0, "io": 0.0, "parallelism": 1},
                {"name": "k", "kind": "sink", "cpu": 0.0, "io": 0.0, "parallelism": 1},
            ],
            "edges": [{"from": "s", "to": "m"}, {"from": "m", "to": "k"}],
        }},
    }))
    .expect("a defaulted StreamJob deserializes");
    assert_eq!(job.spec.job.operators.len(), 3);
}

#[test]
fn flink_scaler_crd_has_target_kinds_and_printer_columns() {
    let yaml = streamscale_operator::flink_scaler_crd::crd_yaml();
    for needle in [
        "kind: FlinkScaler",
        "- fsc",
        "- FlinkDeployment",
        "- FlinkSessionJob",
        ".spec.targetRef.name",
        ".status.totalParallelism",
        "self.min <= self.max",
        "restUrl",
    ] {
        assert!(yaml.contains(needle), "FlinkScaler CRD lacks {needle}");
    }
}

/// The example manifest is a valid FlinkScaler.
#[test]
fn example_flink_scaler_parses() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join("examples/kubernetes/flinkscaler.yaml");
    let text = std::fs::read_to_string(&path).expect("examples/kubernetes/flinkscaler.yaml");
    let scaler: streamscale_operator::flink_scaler_crd::FlinkScaler =
        serde_saphyr::from_str(&text).expect("a FlinkScaler");
    assert_eq!(scaler.spec.target_ref.name, "trace-job");
    assert_eq!(
        scaler.spec.autoscaler.mode,
        streamscale_operator::crd::AutoscalerMode::Recommend
    );
    assert_eq!(
        scaler.spec.autoscaler.parallelism["count -> discard: Writer"].max,
        8
    );
}

/// The `kafka` properties of the StreamJob CRD's operators (source and sink share the name).
fn operator_kafka_properties() -> serde_json::Map<String, serde_json::Value> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(streamscale_operator::crd::StreamJob::crd()).expect("json");
    let kafka = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["job"]["properties"]["operators"]["items"]["properties"]["kafka"];
    kafka["properties"]
        .as_object()
        .cloned()
        .unwrap_or_else(|| panic!("operators' kafka has no properties: {kafka}"))
}

/// Every field of a Kafka source's and a Kafka sink's `kafka` block is in the CRD's schema
/// (a structural-schema API server prunes fields it does not list).
#[test]
fn operator_kafka_schema_has_source_and_sink_fields() {
    let props = operator_kafka_properties();
    for (what, schema) in [
        (
            "source",
            schemars::schema_for!(streamscale_engine::kafka::KafkaSourceSpec),
        ),
        (
            "sink",
            schemars::schema_for!(streamscale_engine::kafka::KafkaSinkSpec),
        ),
    ] {
        let fields = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .unwrap_or_else(|| panic!("{what} spec schema has no properties"));
        assert!(fields.len() >= 3, "{what}: {fields:?}");
        for field in fields.keys() {
            assert!(
                props.contains_key(field),
                "Kafka {what} field `{field}` missing from the CRD's operators[].kafka: {:?}",
                props.keys().collect::<Vec<_>>()
            );
        }
    }
    for field in [
        "transactionalIdPrefix",
        "transactionTimeoutMs",
        "keyBy",
        "eventTime",
    ] {
        assert!(props.contains_key(field), "{field}");
    }
}

/// Model of the API server's pruning of unknown fields against a structural schema (not the
/// real API server): drops object fields the schema does not list, unless it has
/// `x-kubernetes-preserve-unknown-fields`.
fn prune(value: &mut serde_json::Value, schema: &serde_json::Value) {
    use serde_json::Value;
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                m.retain(|k, _| props.contains_key(k));
                for (k, v) in m.iter_mut() {
                    prune(v, &props[k]);
                }
            } else if let Some(extra @ Value::Object(_)) = schema.get("additionalProperties") {
                for v in m.values_mut() {
                    prune(v, extra);
                }
            } else {
                m.clear();
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items.iter_mut().for_each(|v| prune(v, item));
            }
        }
        _ => {}
    }
}

/// A StreamJob with a Kafka source and an exactly-once Kafka sink keeps both blocks' settings
/// when pruned by its CRD's schema (the sink's `transactionalIdPrefix` and
/// `transactionTimeoutMs` were lost when the schema held only the source's `kafka` fields).
#[test]
fn kafka_source_and_sink_settings_survive_schema_pruning() {
    use kube::CustomResourceExt;
    let job: streamscale_operator::crd::StreamJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": "x"},
        "spec": {"job": {
            "name": "x",
            "operators": [
                {"name": "s", "kind": "source", "parallelism": 1, "kafka": {
                    "topic": "in", "bootstrapServers": "k:9092", "group": "g", "keyBy": "user",
                    "valueField": "likes", "eventTime": {"maxOutOfOrdernessMs": 5, "idleTimeoutMs": 100}}},
                {"name": "k", "kind": "sink", "parallelism": 1, "delivery": "exactly-once", "kafka": {
                    "topic": "out", "bootstrapServers": "k:9092",
                    "transactionalIdPrefix": "tx", "transactionTimeoutMs": 60000}},
            ],
            "edges": [{"from": "s", "to": "k"}],
        }},
    }))
    .expect("a StreamJob");
    let crd = serde_json::to_value(streamscale_operator::crd::StreamJob::crd()).expect("json");
    let spec_schema =
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut stored = serde_json::to_value(&job).expect("json");
    prune(&mut stored["spec"], spec_schema);
    let sink_kafka = &stored["spec"]["job"]["operators"][1]["kafka"];
    assert_eq!(sink_kafka["transactionalIdPrefix"], "tx", "{sink_kafka}");
    assert_eq!(sink_kafka["transactionTimeoutMs"], 60000, "{sink_kafka}");
    let back: streamscale_operator::crd::StreamJob =
        serde_json::from_value(stored).expect("the pruned StreamJob deserializes");
    assert_eq!(back.spec, job.spec);
}
