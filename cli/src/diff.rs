//! `silo diff SANDBOX [SNAPSHOT]`: what differs between a sandbox's live
//! tree and one of its snapshots (its latest by default), path by path.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox (name or id).
    #[arg(value_name = "SANDBOX")]
    sandbox: String,
    /// A snapshot (id or unique prefix); the sandbox's latest by default.
    #[arg(value_name = "SNAPSHOT")]
    snapshot: Option<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let report = silo
        .snapshots_of(&args.sandbox)?
        .diff(args.snapshot.as_deref())
        .await
        .with_context(|| format!("comparing {} with its snapshot", args.sandbox))?;
    out.diff(&report)?;
    Ok(0)
}
