//! `streamscale-sim`: replays a workload trace through a model of a job.
//!
//! This first version loads and checks the job and its trace and prints the trace's
//! statistics; the policy replay (issue 4) builds on the same readers.

use std::path::PathBuf;

use clap::Parser;

/// Replays a trace through a model of a job.
#[derive(Debug, Parser)]
#[command(name = "streamscale-sim", version)]
struct Args {
    /// Job spec (YAML), the same file the engine runs.
    job: PathBuf,
}

fn main() {
    let args = Args::parse();
    match streamscale_simulations::load(&args.job) {
        Ok((spec, traces)) => {
            println!("job `{}`: {} operators", spec.name, spec.operators.len());
            for (source, s) in traces {
                println!(
                    "source `{source}`: {} rows every {} s; rate (records/s, scaled) min {:.2} median {:.2} p99 {:.2} max {:.2}; {:.0} records in the replay window",
                    s.rows, s.resolution_s, s.min, s.median, s.p99, s.max, s.records_in_window
                );
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
