//! `silo ls`: every sandbox with its live status.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(silo: &Silo, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let mut rows = Vec::new();
    for sandbox in silo.list()? {
        let status = silo.status(&sandbox).await?;
        rows.push((sandbox, status));
    }
    out.sandboxes(&rows)?;
    Ok(0)
}
