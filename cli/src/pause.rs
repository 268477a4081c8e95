//! `silo pause` and `silo resume`: a provider's pause, which keeps memory
//! and running processes (E2B), unlike `silo stop` on Docker, which ends
//! them. Neither is a snapshot: a snapshot holds files only.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
}

pub async fn pause(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let was_running = silo.pause(&args.sandbox).await?;
    let sandbox = silo.get(&args.sandbox)?;
    out.stopped(&sandbox, was_running, true)?;
    Ok(0)
}

pub async fn resume(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let started = silo.start(&args.sandbox).await?;
    out.started(&started)?;
    Ok(0)
}
