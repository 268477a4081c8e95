//! `silo ls-files SANDBOX [PATH]`: a directory's entries in a sandbox (or
//! the path itself when it is not a directory), symlinks not followed.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// What to list (relative paths start at the sandbox's working directory).
    #[arg(default_value = "/")]
    path: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let entries = sandbox
        .files()
        .entries(&args.path)
        .await
        .with_context(|| format!("listing {}:{}", sandbox.name(), args.path))?;
    out.file_entries(&entries)?;
    Ok(0)
}
