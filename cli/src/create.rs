//! `silo create`: make a sandbox and start it.

use silo::{CreateRequest, Silo};

use super::output::Output;
use super::spec_args::SpecArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Its name (default: a generated one).
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    spec: SpecArgs,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let request = CreateRequest {
        name: args.name,
        spec: args.spec.into_spec()?,
    };
    let sandbox = silo.create(request).await?;
    out.created(&sandbox)?;
    Ok(0)
}
