//! `silo stop`: stop a sandbox, keeping it for a later start.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let was_running = silo.stop(&args.sandbox).await?;
    let sandbox = silo.get(&args.sandbox)?;
    out.stopped(&sandbox, was_running, silo.stop_keeps_processes(&sandbox))?;
    Ok(0)
}
