//! `silo up NAME`: open the sandbox called NAME, or create it (see
//! `Silo::up` for the tiers). With no spec flags it opens whatever exists.

use std::path::Path;

use silo::{BackendKind, Silo, UpAction, UpOutcome, UpRequest};

use super::output::Output;
use super::pool::fill_in_background;
use super::spec_args::SpecArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox's name.
    name: String,
    /// Replace the sandbox's machine if its spec changed (its files are lost)
    /// instead of failing.
    #[arg(long)]
    recreate: bool,
    /// When no sandbox has the name, take a started one from this warm pool
    /// (`silo pool create`) and refill the pool in the background.
    #[arg(long, conflicts_with = "recreate")]
    pool: Option<String>,
    #[command(flatten)]
    spec: SpecArgs,
}

pub async fn run(
    silo: &Silo,
    out: &Output,
    agent: Option<&Path>,
    args: Args,
) -> anyhow::Result<i32> {
    if let Some(pool) = &args.pool {
        if args.spec.given() {
            anyhow::bail!("--pool takes the pool's spec; leave out the spec flags");
        }
        let outcome = silo.up_from_pool(&args.name, pool).await?;
        // The pool is one short now (or was empty): refill it behind us.
        if matches!(outcome.action, UpAction::Claimed | UpAction::Created) {
            fill_in_background(silo, agent, pool)?;
        }
        store_base_in_background(silo, agent, &outcome)?;
        out.up(&outcome)?;
        return Ok(0);
    }
    let spec = if args.spec.given() {
        Some(args.spec.into_spec()?)
    } else {
        None
    };
    let outcome = silo
        .up(UpRequest {
            name: args.name,
            spec,
            recreate: args.recreate,
        })
        .await?;
    store_base_in_background(silo, agent, &outcome)?;
    out.up(&outcome)?;
    Ok(0)
}

/// A sandbox just made from an image: its image goes into the store behind
/// us, so its first snapshot need not wait for the export. A store that
/// has the image answers at once.
fn store_base_in_background(
    silo: &Silo,
    agent: Option<&Path>,
    outcome: &UpOutcome,
) -> anyhow::Result<()> {
    let made = matches!(
        outcome.action,
        UpAction::Created | UpAction::Recreated | UpAction::Claimed
    );
    let from_image = outcome.sandbox.origin_snapshot.is_none();
    if made && from_image && outcome.sandbox.backend == BackendKind::Docker {
        super::background::spawn(silo, agent, &["snapshot", "base", &outcome.sandbox.id])?;
    }
    Ok(())
}
