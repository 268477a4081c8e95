//! `silo ls`: every sandbox with its live status. A backend that cannot be
//! asked (an engine that is down) shows its sandboxes as `unknown` and says
//! why, rather than hiding every other sandbox behind one error.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(silo: &Silo, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let sandboxes = silo.list()?;
    let statuses = silo.statuses(&sandboxes).await;
    let mut rows = Vec::with_capacity(sandboxes.len());
    for (sandbox, status) in sandboxes.into_iter().zip(statuses) {
        let status = match status {
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
