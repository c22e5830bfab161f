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
