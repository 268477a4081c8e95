//! `silo timeout SANDBOX [SECONDS | --clear]`: the sandbox's lifetime
//! deadline. With SECONDS its agent stops it that long from now, whatever
//! runs (its files stay, as with `silo stop`); `--clear` lifts the
//! deadline; with neither, shows the time left. Beside the idle timeout
//! (`--idle-timeout` at create), which only counts time without requests.

use std::time::Duration;

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Stop it this many seconds from now.
    #[arg(conflicts_with = "clear")]
    seconds: Option<u64>,
    /// Lift the deadline.
    #[arg(long)]
    clear: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let left = match (args.seconds, args.clear) {
        (Some(seconds), _) => {
            sandbox
                .set_timeout(Some(Duration::from_secs(seconds)))
                .await
        }
        (None, true) => sandbox.set_timeout(None).await,
        (None, false) => sandbox.timeout().await,
    }
    .with_context(|| format!("the lifetime deadline of {}", sandbox.name()))?;
    out.deadline(sandbox.name(), left)?;
    Ok(0)
}
