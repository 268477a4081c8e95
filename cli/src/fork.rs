//! `silo fork SNAPSHOT --name NEW`: a new sandbox from a snapshot, with the
//! spec its source had; the source is left alone.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot (id or unique prefix).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    /// The new sandbox's name.
    #[arg(long, value_name = "NEW")]
    name: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let progress = out.snapshot_progress();
    let report = silo
        .fork(&args.snapshot, &args.name, &progress.callback())
        .await;
    progress.finish();
    let report = report.with_context(|| format!("forking {}", args.snapshot))?;
    out.restored("made", "from", &report)?;
    Ok(0)
}
