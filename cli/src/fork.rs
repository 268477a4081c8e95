//! `silo fork SNAPSHOT --name NEW [--count N] [--backend B] [--image I]`:
//! new sandboxes from a snapshot, with the spec its source had (on another
//! backend or image when asked), each onto a started sandbox of a pool of
//! that spec when one fits, else a new machine; the source is left alone.
//! A pool a fork took from is refilled behind it, as after `up --pool`.
//!
//! `silo fork SANDBOX --memory --name NEW`: a new sandbox from the
//! provider's capture of a running sandbox with its memory (E2B), on the
//! same backend; refused, saying so, where the backend cannot.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;
use silo::{BackendKind, ForkTarget, Silo};

use super::output::Output;
use super::pool::fill_in_background;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot (id or unique prefix); with `--memory`, the running
    /// sandbox (name or id).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    /// Fork the running sandbox SNAPSHOT names with its memory and
    /// processes, through its provider's own capture (e2b only); silo's
    /// snapshots copy files, and are the way across backends.
    #[arg(long, conflicts_with_all = ["backend", "image", "count"])]
    memory: bool,
    /// The new sandbox's name.
    #[arg(long, value_name = "NEW")]
    name: String,
    /// Make it on another backend (a snapshot taken on docker restores on
    /// podman, and on e2b when the image and the template carry the same
    /// base id, and the other way round) [default: the snapshot's].
    #[arg(long)]
    backend: Option<BackendKind>,
    /// The image (docker, podman) or template (e2b) to make it from; it must carry
    /// the base id of the snapshot's base [default: the snapshot's on the
    /// same backend; on another, an engine finds the image by base id and e2b
    /// uses its default template].
    #[arg(long, visible_alias = "template")]
    image: Option<String>,
    /// Make this many forks at once, named NEW-1 to NEW-N.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(silo::MAX_FORKS)))]
    count: u32,
}

pub async fn run(
    silo: &Silo,
    out: &Output,
    agent: Option<&Path>,
    args: Args,
) -> anyhow::Result<i32> {
    if args.memory {
        let sandbox = silo
            .fork_with_memory(&args.snapshot, &args.name)
            .await
            .with_context(|| format!("forking {} with its memory", args.snapshot))?;
        out.created(&sandbox)?;
        return Ok(0);
    }
    let target = ForkTarget {
        backend: args.backend,
        image: args.image,
    };
    if args.count == 1 {
        let progress = out.snapshot_progress();
        let report = silo
            .fork(&args.snapshot, &args.name, &target, &progress.callback())
            .await;
        progress.finish();
        let report = report.with_context(|| format!("forking {}", args.snapshot))?;
        if let Some(pool) = &report.pool {
            fill_in_background(silo, agent, pool)?;
        }
        out.restored("made", "from", &report)?;
        return Ok(0);
    }
    let outcomes = silo
        .fork_many(&args.snapshot, &args.name, args.count, &target)
        .await
        .with_context(|| format!("forking {}", args.snapshot))?;
    let pools: BTreeSet<&str> = outcomes
        .iter()
        .filter_map(|(_, outcome)| outcome.as_ref().ok()?.pool.as_deref())
        .collect();
    for pool in pools {
        fill_in_background(silo, agent, pool)?;
    }
    let mut failed = 0;
    let mut reports = Vec::new();
    for (name, outcome) in outcomes {
        match outcome {
            Ok(report) => reports.push(report),
            Err(error) => {
                failed += 1;
                let error = anyhow::Error::from(error)
                    .context(format!("forking {} as {name}", args.snapshot));
                eprintln!("silo: {error:#}");
            }
        }
    }
    out.forks(&reports)?;
    Ok(if failed == 0 { 0 } else { 1 })
}
