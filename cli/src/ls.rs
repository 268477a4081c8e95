//! `silo ls`: every sandbox with its live status. A backend that cannot be
//! asked (an engine that is down) shows its sandboxes as `unknown` and says
//! why, rather than hiding every other sandbox behind one error.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(silo: &Silo, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let mut rows = Vec::new();
    for sandbox in silo.list()? {
        let status = match silo.status(&sandbox).await {
            Ok(status) => Some(status),
            Err(error) => {
                out.error(&anyhow::Error::new(error));
                None
            }
        };
        rows.push((sandbox, status));
    }
    out.sandboxes(&rows)?;
    Ok(0)
}
