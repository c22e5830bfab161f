//! Writes the CRDs: `crdgen` prints them; `crdgen DIR...` writes `streamjob.yaml` (StreamJob and
//! StreamQuota) and `flinkscaler.yaml` (FlinkScaler) into each DIR (the checked-in copies are in
//! `crds/` and `charts/streamscale/crds/`); `crdgen FILE` writes the StreamJob file only.

fn main() -> anyhow::Result<()> {
    let files = [
        ("streamjob.yaml", streamscale_operator::crd::crd_yaml()),
        (
            "flinkscaler.yaml",
            streamscale_operator::flink_scaler_crd::crd_yaml(),
        ),
    ];
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        for (_, yaml) in &files {
            print!("---\n{yaml}");
        }
    }
    for path in paths {
        let p = std::path::Path::new(&path);
        let targets: Vec<(std::path::PathBuf, &String)> = if p.is_dir() {
            files
                .iter()
                .map(|(name, yaml)| (p.join(name), yaml))
                .collect()
        } else {
            vec![(p.to_path_buf(), &files[0].1)]
        };
        for (target, yaml) in targets {
            std::fs::write(&target, yaml)
                .map_err(|e| anyhow::anyhow!("{}: {e}", target.display()))?;
            eprintln!("wrote {}", target.display());
        }
    }
    Ok(())
}
