//! `silo start`: bring a stopped sandbox back.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let started = silo.start(&args.sandbox).await?;
    out.started(&started)?;
    Ok(0)
}
