//! `silo fork SNAPSHOT --name NEW [--backend B] [--image I]`: a new sandbox
//! from a snapshot, with the spec its source had (on another backend or
//! image when asked); the source is left alone.

use anyhow::Context;
use silo::{BackendKind, ForkTarget, Silo};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot (id or unique prefix).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
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
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
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
