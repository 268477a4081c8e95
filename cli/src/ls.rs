//! `silo ls`: every sandbox with its live status and the host that made
//! it. A backend that cannot be asked (an engine that is down) shows its
//! sandboxes as `unknown` and says why, rather than hiding every other
//! sandbox behind one error; a machine on another host of the fleet is
//! shown as `elsewhere`, unasked (only its host can reach it).

use silo::Silo;

use super::output::{Listed, Output};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(silo: &Silo, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let (here, elsewhere): (Vec<_>, Vec<_>) = silo
        .list()?
        .into_iter()
        .partition(|sandbox| silo.fleet().may_operate(sandbox));
    let statuses = silo.statuses(&here).await;
    let mut rows = Vec::with_capacity(here.len() + elsewhere.len());
    for (sandbox, status) in here.into_iter().zip(statuses) {
        let status = match status {
            Ok(status) => Listed::State(status),
            Err(error) => {
                out.error(&anyhow::Error::new(error));
                Listed::Unknown
            }
        };
        rows.push((sandbox, status));
    }
    rows.extend(
        elsewhere
            .into_iter()
            .map(|sandbox| (sandbox, Listed::Elsewhere)),
    );
    rows.sort_by(|(a, _), (b, _)| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    out.sandboxes(&rows)?;
    Ok(0)
}
