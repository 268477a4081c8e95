//! Work a command leaves to a `silo` process of its own: refilling a warm
//! pool after a claim, storing a new sandbox's image for its first
//! snapshot. The process outlives this one and keeps to itself (no
//! terminal, its own process group), on the same home and agent, so the
//! command answers at once and no daemon is needed.

use std::path::Path;
use std::process::{Command, Stdio};

use silo::Silo;

/// Starts `silo ARGS...` in the background.
pub fn spawn(silo: &Silo, agent: Option<&Path>, args: &[&str]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.arg("--home").arg(silo.home().root());
    if let Some(agent) = agent {
        command.arg("--agent").arg(agent);
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn()?;
    Ok(())
}
