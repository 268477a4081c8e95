//! `silo events`: a sandbox's history, removed sandboxes included.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
}

pub fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    out.events(&silo.events(&args.sandbox)?)?;
    Ok(0)
}
