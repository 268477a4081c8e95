//! `silo rewind SANDBOX SNAPSHOT`: replace a sandbox's machine with one made
//! from its snapshot, keeping its id, mounts, network, env and labels.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox (name or id).
    #[arg(value_name = "SANDBOX")]
    sandbox: String,
    /// One of its snapshots (id or unique prefix).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let snapshots = silo.snapshots_of(&args.sandbox)?;
    let progress = out.snapshot_progress();
    let report = snapshots
        .with_progress(progress.callback())
        .rewind(&args.snapshot)
        .await;
    progress.finish();
    let report = report.with_context(|| format!("rewinding {}", args.sandbox))?;
    out.restored("rewound", "to", &report)?;
    Ok(0)
}
