//! The checked-in CRD (`crds/streamjob.yaml` and the chart's copy) must match the Rust types.

use std::path::PathBuf;

#[test]
fn checked_in_crd_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let want = streamscale_operator::crd::crd_yaml();
    for rel in [
        "crds/streamjob.yaml",
        "charts/streamscale/crds/streamjob.yaml",
    ] {
        let have = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
        assert!(
            have == want,
            "{rel} is stale: regenerate with `cargo run -p streamscale-operator --bin crdgen -- crds/streamjob.yaml charts/streamscale/crds/streamjob.yaml`"
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
