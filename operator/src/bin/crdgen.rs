//! Writes the StreamJob CRD: `crdgen` prints it, `crdgen PATH` writes it to PATH
//! (the checked-in copy is `crds/streamjob.yaml`; the chart's copy is `charts/streamscale/crds/`).

fn main() -> anyhow::Result<()> {
    let yaml = streamscale_operator::crd::crd_yaml();
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        print!("{yaml}");
    }
    for path in paths {
        std::fs::write(&path, &yaml).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}
