//! `silo snapshot SANDBOX [-m MESSAGE]`: capture a sandbox's file system;
//! `silo snapshot rm ID`: delete a snapshot; `silo snapshot base SANDBOX`:
//! store the image it was made from ahead of its first snapshot.

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
    /// Store the image a sandbox was made from, so its first snapshot
    /// stores only the sandbox's changes (`silo up` starts this in the
    /// background for a new Docker sandbox).
    Base {
        /// The sandbox (name or id).
        sandbox: String,
    },
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
    if let Some(Command::Base { sandbox }) = args.command {
        let stored = silo
            .store_base(&sandbox)
            .await
            .with_context(|| format!("storing the image of {sandbox}"))?;
        out.base_stored(&sandbox, stored.as_ref())?;
        return Ok(0);
    }
    let sandbox = args.sandbox.unwrap_or_default();
    let progress = out.snapshot_progress();
    let report = silo
        .snapshot(&sandbox, args.message, &progress.callback())
        .await;
    progress.finish();
    let report = report.with_context(|| format!("snapshotting {sandbox}"))?;
    out.snapshot_taken(&report)?;
    Ok(0)
}
