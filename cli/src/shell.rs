//! `silo shell`: an interactive shell in a sandbox, on a pseudo-terminal.
//!
//! The sandbox's own shell (bash if it has one, else sh), or with `--session`
//! one started from that session's last known cwd and exported variables.
//! What is done in it stays in it: the session's own shell is not changed.

use silo::Silo;
use silo_protocol::exec::ExecSpec;

use super::exec;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Start from this session's cwd and environment (created on first use).
    #[arg(long, value_name = "ID")]
    session: Option<String>,
}

pub async fn run(silo: &Silo, args: Args) -> anyhow::Result<i32> {
    let mut spec = ExecSpec {
        session: args.session,
        ..ExecSpec::default()
    };
    exec::ask_for_terminal(&mut spec);
    exec::execute(silo, &args.sandbox, spec, true).await
}
