//! `silo up NAME`: open the sandbox called NAME, or create it (see
//! `Silo::up` for the tiers). With no spec flags it opens whatever exists.

use silo::{Silo, UpRequest};

use super::output::Output;
use super::spec_args::SpecArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox's name.
    name: String,
    /// Replace the sandbox's machine if its spec changed (its files are lost)
    /// instead of failing.
    #[arg(long)]
    recreate: bool,
    #[command(flatten)]
    spec: SpecArgs,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
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
