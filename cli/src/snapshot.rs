//! `silo snapshot SANDBOX [-m MESSAGE]`: capture a sandbox's file system;
//! `silo snapshot rm ID`: delete a snapshot.

use anyhow::Context;
use clap::Subcommand;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// The sandbox (name or id).
    #[arg(value_name = "SANDBOX", required = true)]
    sandbox: Option<String>,
    /// What this snapshot is, in words.
    #[arg(short, long, value_name = "MESSAGE")]
    message: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Delete snapshots (their blobs go at the next `silo gc`).
    Rm {
        /// Snapshot ids (or unique prefixes).
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    if let Some(Command::Rm { ids }) = args.command {
        let mut failed = false;
        for id in &ids {
            match silo.remove_snapshot(id).await {
                Ok(snapshot) => out.snapshot_removed(&snapshot)?,
                Err(error) => {
                    failed = true;
                    out.error(&anyhow::Error::new(error));
                }
            }
        }
        return Ok(i32::from(failed));
    }
    let sandbox = args.sandbox.unwrap_or_default();
    let snapshots = silo.snapshots_of(&sandbox)?;
    let progress = out.snapshot_progress();
    let report = snapshots
        .with_progress(progress.callback())
        .take(args.message)
        .await;
    progress.finish();
    let report = report.with_context(|| format!("snapshotting {sandbox}"))?;
    out.snapshot_taken(&report)?;
    Ok(0)
}
