//! `silo snapshots [SANDBOX]`: list snapshots, oldest first.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this sandbox's (name or id; the id of a removed sandbox works too).
    #[arg(value_name = "SANDBOX")]
    sandbox: Option<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let snapshots = silo.snapshots(args.sandbox.as_deref())?;
    out.snapshots(&snapshots)?;
    Ok(0)
}
