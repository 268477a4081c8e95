//! `silo pool`: warm pools of started sandboxes that `silo up NAME --pool
//! POOL` takes from (see `Silo::up_from_pool`).

use std::path::Path;
use std::process::{Command, Stdio};

use silo::Silo;

use super::output::Output;
use super::spec_args::SpecArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: PoolCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PoolCommand {
    /// Make a pool that keeps SIZE started sandboxes of a spec ready, and fill it.
    Create {
        /// The pool's name.
        name: String,
        /// How many sandboxes to keep ready.
        #[arg(long)]
        size: u32,
        /// Keep forks of this snapshot ready instead (its spec; no spec
        /// flags): `silo fork SNAPSHOT` then claims one that stands on it.
        #[arg(long, value_name = "SNAPSHOT")]
        snapshot: Option<String>,
        /// Record the pool and fill it in the background instead of waiting.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        spec: Box<SpecArgs>,
    },
    /// List pools with how many sandboxes each has ready.
    Ls,
    /// Remove a pool and its waiting sandboxes.
    Rm {
        /// The pool's name.
        name: String,
    },
    /// Make the sandboxes a pool lacks, now.
    Fill {
        /// The pool's name.
        name: String,
    },
}

pub async fn run(
    silo: &Silo,
    out: &Output,
    agent: Option<&Path>,
    args: Args,
) -> anyhow::Result<i32> {
    match args.command {
        PoolCommand::Create {
            name,
            size,
            snapshot,
            no_wait,
            spec,
        } => {
            let pool = match snapshot {
                Some(_) if spec.given() => anyhow::bail!(
                    "a pool on a snapshot has the snapshot's spec; leave out the spec flags"
                ),
                Some(snapshot) => silo.create_pool_on_snapshot(&name, &snapshot, size)?,
                None => silo.create_pool(&name, spec.into_spec()?, size)?,
            };
            if no_wait {
                fill_in_background(silo, agent, &pool.name)?;
                return out.pools(&silo.pools()?).map(|()| 0);
            }
            let report = silo.fill_pool(&pool.name).await?;
            out.filled(&pool.name, &report)?;
            Ok(if report.failed.is_empty() { 0 } else { 1 })
        }
        PoolCommand::Ls => out.pools(&silo.pools()?).map(|()| 0),
        PoolCommand::Rm { name } => {
            let members = silo.remove_pool(&name).await?;
            out.pool_removed(&name, members).map(|()| 0)
        }
        PoolCommand::Fill { name } => {
            let report = silo.fill_pool(&name).await?;
            out.filled(&name, &report)?;
            Ok(if report.failed.is_empty() { 0 } else { 1 })
        }
    }
}

/// Starts `silo pool fill POOL` as a process of its own, on this home and
/// agent, which outlives this one and keeps to itself (no terminal, its
/// own process group): the caller answers at once and the pool is full
/// again shortly after.
pub fn fill_in_background(silo: &Silo, agent: Option<&Path>, pool: &str) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.arg("--home").arg(silo.home().root());
    if let Some(agent) = agent {
        command.arg("--agent").arg(agent);
    }
    command
        .args(["pool", "fill", pool])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn()?;
    Ok(())
}
