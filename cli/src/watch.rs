//! `silo watch SANDBOX DIR`: a directory's changes as they happen, a line
//! each (`create sub/a.txt`; with `--json`, one JSON object a line), until
//! Ctrl-C or the directory goes away.

use anyhow::Context;
use silo::Silo;
use silo::client::WatchEvent;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// The directory (relative paths start at the sandbox's working directory).
    path: String,
    /// Its subdirectories too, those made later included.
    #[arg(short, long)]
    recursive: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let mut watch = sandbox
        .files()
        .watch(&args.path, args.recursive)
        .await
        .with_context(|| format!("watching {}:{}", sandbox.name(), args.path))?;
    loop {
        let event = tokio::select! {
            event = watch.next() => event,
            _ = tokio::signal::ctrl_c() => return Ok(0),
        };
        match event {
            Some(WatchEvent::Changes(events)) => {
                let code = out.fs_events(&events)?;
                if code != 0 {
                    return Ok(code);
                }
            }
            Some(WatchEvent::Ended(reason)) => {
                anyhow::bail!(
                    "the watch of {}:{} ended: {reason}",
                    sandbox.name(),
                    args.path
                )
            }
            None => anyhow::bail!("lost the connection to the agent of {}", sandbox.name()),
        }
    }
}
