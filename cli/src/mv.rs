//! `silo mv SANDBOX FROM TO`: rename a path in a sandbox in one step
//! (atomic, within one file system), making missing parents of `TO`.

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// The path to move (relative paths start at the sandbox's working directory).
    from: String,
    /// Its new name; a file there is replaced, a directory only when empty.
    to: String,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = silo.running_sandbox(&args.sandbox).await?;
    let moved = sandbox
        .files()
        .rename(&args.from, &args.to)
        .await
        .with_context(|| format!("moving {}:{} to {}", sandbox.name(), args.from, args.to))?;
    out.file_entries(std::slice::from_ref(&moved))?;
    Ok(0)
}
