//! `silo rm`: remove sandboxes, carrying on past failures.

use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names or ids.
    #[arg(required_unless_present = "all", value_name = "SANDBOX")]
    sandboxes: Vec<String>,
    /// Remove every sandbox.
    #[arg(long, conflicts_with = "sandboxes")]
    all: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let targets = if args.all {
        silo.list()?.into_iter().map(|s| s.id).collect()
    } else {
        args.sandboxes
    };
    let mut removed = Vec::new();
    let mut failed = false;
    for name in &targets {
        match silo.remove(name).await {
            Ok(sandbox) => removed.push(sandbox),
            Err(error) => {
                failed = true;
                out.error(&anyhow::Error::new(error));
            }
        }
    }
    out.removed(&removed)?;
    Ok(i32::from(failed))
}
