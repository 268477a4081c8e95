//! Host-process plumbing for the local backend: spawning the agent detached,
//! recognising it later from another process, and stopping it.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::agent_binary::AGENT_FILE_NAME;
use crate::retry::Deadline;
use crate::spec::SandboxSpec;

/// How long a stopping agent gets to shut its commands down after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for the kernel to finish a SIGKILLed agent.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// Pause between looks at a process that is going away.
const EXIT_POLL: Duration = Duration::from_millis(5);

/// The `--listen` value for a Unix socket.
pub fn listen_arg(socket: &Path) -> OsString {
    let mut arg = OsString::from("unix:");
    arg.push(socket);
    arg
}

/// Starts the agent in a new session, detached from the caller's terminal and
/// process group, so it outlives this process and a Ctrl-C at the terminal
/// never reaches it (or, through it, any sandbox command).
pub fn spawn_agent(
    agent: &Path,
    spec: &SandboxSpec,
    socket: &Path,
    key_file: &Path,
    workdir: &Path,
    log: File,
) -> io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(agent);
    // A fixed argv[0] is what lets `is_our_agent` recognise the process,
    // whatever the binary's file name (a hash-suffixed copy, a custom build).
    cmd.arg0(AGENT_FILE_NAME)
        .arg("--listen")
        .arg(listen_arg(socket))
        .arg("--key-file")
        .arg(key_file)
        .arg("--workdir")
        .arg(workdir)
        // A host process has no private `/`: sandbox paths of pushes (mount
        // /workspace/managed/app) live under its root directory instead.
        .arg("--push-base")
        .arg(workdir)
        // A local spec has no workdir of its own (the spec check refuses
        // one), so this adds only the idle timeout, restart and workload.
        .args(crate::backend::agent_flags(spec, &spec.workload));
    cmd.current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // The key travels in the file; never let one from our own environment leak in.
        .env_remove("SILO_AGENT_KEY")
        .envs(&spec.env)
        // The agent must outlive this process; dropping the handle must not kill it.
        .kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // setsid(2), which is async-signal-safe; it touches no memory shared with
    // the parent and allocates nothing.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from));
    }
    cmd.spawn()
}

/// Whether `pid` is alive (a zombie counts as dead: it will never serve again).
pub fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the command name, which is in parentheses and
    // may itself contain spaces and parentheses: find the last ')'.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    !matches!(stat.get(close + 2), Some(b'Z' | b'X') | None)
}

/// Whether `pid` is a live silo-agent serving `socket`: a recycled pid
/// belongs to some other program, or to an agent of another sandbox.
pub fn is_our_agent(pid: u32, socket: &Path) -> bool {
    if !is_alive(pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let Some(argv0) = args.first() else {
        return false;
    };
    let listen = listen_arg(socket);
    argv0.ends_with(AGENT_FILE_NAME.as_bytes())
        && args
            .windows(2)
            .any(|w| w[0] == b"--listen" && w[1] == listen.as_bytes())
}

/// Sends SIGTERM, waits up to [`STOP_GRACE`], then SIGKILLs. Returns once the
/// process is gone, or fails if even SIGKILL did not end it in time.
pub async fn terminate(pid: u32) -> Result<(), TerminateError> {
    let target = Pid::from_raw(i32::try_from(pid).map_err(|_| TerminateError::BadPid(pid))?);
    if !signal(target, Signal::SIGTERM)? {
        return Ok(());
    }
    if wait_gone(pid, STOP_GRACE).await {
        return Ok(());
    }
    tracing::warn!(
        pid,
        "agent ignored SIGTERM for {STOP_GRACE:?}; sending SIGKILL"
    );
    if !signal(target, Signal::SIGKILL)? || wait_gone(pid, KILL_WAIT).await {
        return Ok(());
    }
    Err(TerminateError::Survived(pid))
}

/// Sends a signal; `Ok(false)` if the process was already gone.
fn signal(pid: Pid, sig: Signal) -> Result<bool, TerminateError> {
    match kill(pid, sig) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(errno) => Err(TerminateError::Signal {
            pid: pid.as_raw(),
            errno,
        }),
    }
}

async fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Deadline::after(within, EXIT_POLL);
    loop {
        if !is_alive(pid) {
            return true;
        }
        if !deadline.pause().await {
            return false;
        }
    }
}

/// Why an agent process could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum TerminateError {
    /// The recorded pid does not fit a pid.
    #[error("recorded agent pid {0} is not a valid pid")]
    BadPid(u32),
    /// The kernel refused the signal.
    #[error("cannot signal agent pid {pid}")]
    Signal {
        /// The process.
        pid: i32,
        /// Why.
        #[source]
        errno: Errno,
    },
    /// It outlived SIGKILL.
    #[error("agent pid {0} is still alive after SIGKILL")]
    Survived(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_itself_alive_but_not_as_an_agent() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(!is_our_agent(me, Path::new("/tmp/x.sock")));
        assert!(!is_alive(u32::MAX));
    }

    #[tokio::test]
    async fn terminate_stops_a_process_and_tolerates_a_dead_one() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let reaper = tokio::spawn(async move { child.wait().await });
        terminate(pid).await.unwrap();
        assert!(reaper.await.unwrap().is_ok());
        terminate(pid).await.unwrap();
    }
}
