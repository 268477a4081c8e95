//! `silo hosts`: the hosts that share this state, each with the sandboxes
//! it made and when it last used the state. One host on a home's own
//! database; every host of a fleet on a shared one (`SILO_STATE_URL`).

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(silo: &Silo, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let hosts = silo.hosts()?;
    let sandboxes = silo.list()?;
    out.hosts(&silo.fleet().host, &hosts, &sandboxes)?;
    Ok(0)
}
