//! `silo ps SANDBOX`: the commands its agent runs (and, with `--all`, those
//! that ended while their result is still held), with what they run.

use anyhow::Context;
use silo::Silo;
use silo_protocol::exec::ExecState;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Also the commands that have ended (held for 10 minutes).
    #[arg(short, long)]
    all: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let mut execs = sandbox
        .commands()
        .list()
        .await
        .with_context(|| format!("listing the commands of {}", sandbox.name()))?;
    if !args.all {
        execs.retain(|e| e.state == ExecState::Running);
    }
    out.execs(&execs)?;
    Ok(0)
}
