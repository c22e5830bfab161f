//! The simulator benchmark: the 55-day NAB AAPL trace (5-minute resolution) through the
//! 6-operator example job (`examples/sim/six-ops.yaml`) in the fast mode, every policy.
//! Run with `cargo bench -p streamscale-simulations --bench replay55`.

use std::path::Path;
use std::time::Instant;

use streamscale_engine::spec::JobSpec;
use streamscale_simulations::config::SimConfig;
use streamscale_simulations::model::JobModel;
use streamscale_simulations::policy::POLICIES;
use streamscale_simulations::runner::{Mode, ReplayOptions, default_step, replay_all};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sim/six-ops.yaml");
    let spec = JobSpec::from_file(&job)?;
    let cfg = SimConfig::default();
    let names: Vec<String> = POLICIES.iter().map(|s| s.to_string()).collect();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let model = JobModel::new(&spec, &cfg, None)?;
        let opts = ReplayOptions {
            mode: Mode::Fast,
            step_s: default_step(model.duration_s),
            seed: 1,
            max_rows: 2000,
            threads: 0,
            engine_p99: false,
        };
        let (summary, runs) = replay_all(&model, &names, &opts, &cfg, &|_| {})?;
        let secs = start.elapsed().as_secs_f64();
        best = best.min(secs);
        for r in &runs {
            if let Some((made, skipped)) = r.planner_calls {
                println!(
                    "{}: {made} planner calls, {skipped} skipped (stationary)",
                    r.name
                );
            }
        }
        println!(
            "{:.1} days, {} policies: {secs:.3} s (streamscale {:.1} resource-h)",
            model.duration_s / 86400.0,
            summary.policies.len(),
            summary
                .policies
                .get("streamscale")
                .map_or(0.0, |p| p.resource_hours)
        );
    }
    println!("best of 3: {best:.3} s (target < 2 s)");
    Ok(())
}
