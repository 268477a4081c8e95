//! `silo up NAME`: open the sandbox called NAME, or create it (see
//! `Silo::up` for the tiers). With no spec flags it opens whatever exists.

use std::path::Path;

use silo::{Silo, UpAction, UpRequest};

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
    out.up(&outcome)?;
    Ok(0)
}
