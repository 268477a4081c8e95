//! `silo session`: list, interrupt and close a sandbox's shell sessions.
//!
//! Commands run in a session with `silo exec --session ID`, which creates it
//! on first use; this is for looking at sessions and cleaning them up.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// List a sandbox's sessions.
    Ls {
        /// Name or id.
        sandbox: String,
    },
    /// Interrupt what a session is running (a no-op when it is idle).
    Interrupt {
        /// Name or id.
        sandbox: String,
        /// The session.
        id: String,
        /// Kill at once instead of after the grace period.
        #[arg(long)]
        kill: bool,
    },
    /// Close a session: kill its command, its shell and what it started.
    Close {
        /// Name or id.
        sandbox: String,
        /// The session.
        id: String,
    },
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandbox = match &args.action {
        Action::Ls { sandbox }
        | Action::Interrupt { sandbox, .. }
        | Action::Close { sandbox, .. } => silo.get(sandbox)?,
    };
    let connection = silo.connect(&sandbox).await?;
    match args.action {
        Action::Ls { .. } => {
            let sessions = connection
                .list_sessions()
                .await
                .context("listing sessions")?;
            out.sessions(&sessions)?;
        }
        Action::Interrupt { id, kill, .. } => {
            let grace = kill.then_some(Duration::ZERO);
            let exec_id = connection
                .interrupt_session(&id, grace)
                .await
                .context("interrupting the session")?;
            out.session_interrupted(&id, exec_id)?;
        }
        Action::Close { id, .. } => {
            let existed = connection
                .close_session(&id)
                .await
                .context("closing the session")?;
            out.session_closed(&id, existed)?;
            if !existed {
                return Ok(1);
            }
        }
    }
    Ok(0)
}
