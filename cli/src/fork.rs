//! `silo fork SNAPSHOT --name NEW [--backend B] [--image I]`: a new sandbox
//! from a snapshot, with the spec its source had (on another backend or
//! image when asked); the source is left alone.
//!
//! `silo fork SANDBOX --memory --name NEW`: a new sandbox from the
//! provider's capture of a running sandbox with its memory (E2B), on the
//! same backend; refused, saying so, where the backend cannot.

use anyhow::Context;
use silo::{BackendKind, ForkTarget, Silo};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot (id or unique prefix); with `--memory`, the running
    /// sandbox (name or id).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    /// Fork the running sandbox SNAPSHOT names with its memory and
    /// processes, through its provider's own capture (e2b only); silo's
    /// snapshots copy files, and are the way across backends.
    #[arg(long, conflicts_with_all = ["backend", "image"])]
    memory: bool,
    /// The new sandbox's name.
    #[arg(long, value_name = "NEW")]
    name: String,
    /// Make it on another backend (a snapshot taken on docker restores on
    /// e2b and the other way round, when the image and the template carry
    /// the same base id) [default: the snapshot's].
    #[arg(long)]
    backend: Option<BackendKind>,
    /// The image (docker) or template (e2b) to make it from; it must carry
    /// the base id of the snapshot's base [default: the snapshot's on the
    /// same backend; on another, docker finds the image by base id and e2b
    /// uses its default template].
    #[arg(long, visible_alias = "template")]
    image: Option<String>,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    if args.memory {
        let sandbox = silo
            .fork_with_memory(&args.snapshot, &args.name)
            .await
            .with_context(|| format!("forking {} with its memory", args.snapshot))?;
        out.created(&sandbox)?;
        return Ok(0);
    }
    let progress = out.snapshot_progress();
    let target = ForkTarget {
        backend: args.backend,
        image: args.image,
    };
    let report = silo
        .fork(&args.snapshot, &args.name, &target, &progress.callback())
        .await;
    progress.finish();
    let report = report.with_context(|| format!("forking {}", args.snapshot))?;
    out.restored("made", "from", &report)?;
    Ok(0)
}
