//! `silo doctor`: the host's fitness for silo, one line per check, with the
//! fix for each warning or failure. Exits 1 when any check failed.

use silo::SiloOptions;
use silo::doctor::{Verdict, diagnose};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(options: SiloOptions, out: &Output, _args: Args) -> anyhow::Result<i32> {
    let checks = diagnose(options).await;
    out.doctor(&checks)?;
    let failed = checks.iter().any(|c| c.verdict == Verdict::Fail);
    Ok(i32::from(failed))
}
