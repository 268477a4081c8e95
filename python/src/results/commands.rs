//! A command's results: how it ended (`CommandResult`), the events a
//! followed command gives (`Stdout`, `Stderr`, `Lost`, `Exit`), and what the
//! agent says of its sessions and commands (`SessionInfo`, `ProcessInfo`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use silo::ExitInfo;
use silo::silo_protocol::exec::{ExecState, ExecSummary};
use silo::silo_protocol::session;

use super::{json_dict, no_bytes, words};

result_class! {
    /// How a command ended and what it printed (E2B's ``CommandResult``).
    CommandResult {
        /// Everything it wrote to stdout, decoded as UTF-8 (bad bytes replaced).
        stdout: Py<PyString>,
        /// Everything it wrote to stderr, decoded likewise.
        stderr: Py<PyString>,
        /// Its exit code; 128 + the signal when a signal ended it.
        exit_code: i32,
        /// Why it failed in words, or ``None`` when it exited 0.
        error: Option<String> = None,
        /// The raw bytes of stdout.
        stdout_bytes: Py<PyBytes> = { no_bytes() },
        /// The raw bytes of stderr.
        stderr_bytes: Py<PyBytes> = { no_bytes() },
        /// Output bytes the agent no longer held when this client came back
        /// for them (never dropped silently: counted here).
        lost_bytes: u64 = 0,
        /// The signal that ended it, if one did.
        signal: Option<i32> = None,
        /// An interrupt (``interrupt()``, ``kill()``, Ctrl-C) ended it.
        interrupted: bool = false,
        /// Its timeout ended it.
        timed_out: bool = false,
        /// Wall time from start to exit, in milliseconds.
        duration_ms: u64 = 0,
        /// Session runs: the session's shell had died and was started again
        /// with its last cwd and environment (shell variables were lost).
        restored: bool = false,
        /// A rewind of the sandbox ended it: the snapshot it went back to
        /// (``""`` when the rewind did not say).
        ended_by_rewind: Option<String> = None,
    }
}

impl CommandResult {
    /// What a command printed, with the `lost` bytes it could not get back,
    /// and its `exit` (a default one when the exit was never seen: 255).
    pub fn of(
        py: Python<'_>,
        stdout: &[u8],
        stderr: &[u8],
        lost: u64,
        exit: &ExitInfo,
    ) -> PyResult<Self> {
        let stdout_bytes = PyBytes::new(py, stdout);
        let stderr_bytes = PyBytes::new(py, stderr);
        let exit_code = exit.shell_code();
        Ok(Self {
            stdout: decoded(&stdout_bytes)?,
            stderr: decoded(&stderr_bytes)?,
            exit_code,
            error: failure(exit, exit_code),
            stdout_bytes: stdout_bytes.unbind(),
            stderr_bytes: stderr_bytes.unbind(),
            lost_bytes: lost,
            signal: exit.signal,
            interrupted: exit.interrupted,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
            restored: exit.restored,
            ended_by_rewind: exit.ended_by_rewind.clone(),
        })
    }
}

/// Output as text, by Python's own decoder: what a `bytes.decode("utf-8",
/// "replace")` of it gives, to the character.
fn decoded(data: &Bound<'_, PyBytes>) -> PyResult<Py<PyString>> {
    Ok(PyString::from_encoded_object(data.as_any(), Some(c"utf-8"), Some(c"replace"))?.unbind())
}

/// Why a command failed, in words; `None` when it exited 0. A timeout
/// comes first, since `checked` raises it whatever else is true.
fn failure(exit: &ExitInfo, exit_code: i32) -> Option<String> {
    if exit.timed_out {
        Some("the command timed out".to_owned())
    } else if let Some(snapshot) = &exit.ended_by_rewind {
        Some(if snapshot.is_empty() {
            "the command was ended by a rewind".to_owned()
        } else {
            format!("the command was ended by a rewind to {snapshot}")
        })
    } else if exit.interrupted {
        Some("the command was interrupted".to_owned())
    } else if let Some(signal) = exit.signal {
        Some(format!("the command was killed by signal {signal}"))
    } else if exit_code != 0 {
        Some(format!("the command exited with code {exit_code}"))
    } else {
        None
    }
}

result_class! {
    /// Output a command wrote to stdout, at byte ``offset`` of its output.
    Stdout {
        data: Py<PyBytes>,
        offset: u64,
    }
}

result_class! {
    /// Output a command wrote to stderr, at byte ``offset`` of its output.
    Stderr {
        data: Py<PyBytes>,
        offset: u64,
    }
}

impl Stdout {
    /// Bytes at `offset` of the command's output.
    pub fn of(py: Python<'_>, data: &[u8], offset: u64) -> Self {
        Self {
            data: PyBytes::new(py, data).unbind(),
            offset,
        }
    }
}

impl Stderr {
    /// Bytes at `offset` of the command's output.
    pub fn of(py: Python<'_>, data: &[u8], offset: u64) -> Self {
        Self {
            data: PyBytes::new(py, data).unbind(),
            offset,
        }
    }
}

result_class! {
    /// ``count`` output bytes from ``offset`` that the agent no longer held.
    Lost {
        offset: u64,
        count: u64,
    }
}

impl Lost {
    /// `count` bytes from `offset`.
    pub fn of(offset: u64, count: u64) -> Self {
        Self { offset, count }
    }
}

result_class! {
    /// The command ended; nothing follows.
    Exit {
        /// Its exit code, as ``CommandResult.exit_code`` has it.
        exit_code: i32,
        /// How it ended, as the agent said it (``code``, ``signal``,
        /// ``duration_ms``, ``interrupted``, ``timed_out``, ...).
        info: Py<PyDict>,
    }
}

impl Exit {
    /// The event of `exit`.
    pub fn of(py: Python<'_>, exit: &ExitInfo) -> PyResult<Self> {
        Ok(Self {
            exit_code: exit.shell_code(),
            info: json_dict(py, exit)?,
        })
    }
}

result_class! {
    /// One shell session of a sandbox (``commands.sessions``).
    SessionInfo {
        id: String,
        shell: String,
        /// The shell's pid, while it runs.
        pid: Option<u32>,
        /// Its working directory after its last command.
        cwd: String,
        /// The id of the command it runs now (``commands.connect`` follows it), if any.
        running: Option<u64>,
        /// That command's text.
        command: Option<String>,
        /// Commands waiting for it.
        queued: u32,
    }
}

impl SessionInfo {
    /// What the agent says of one session.
    pub fn of(_py: Python<'_>, info: &session::SessionInfo) -> PyResult<Self> {
        Ok(Self {
            id: info.id.clone(),
            shell: info.shell.clone(),
            pid: info.pid,
            cwd: info.cwd.clone(),
            running: info.running,
            command: info.command.clone(),
            queued: info.queued,
        })
    }
}

result_class! {
    /// One command the sandbox's agent holds (E2B's ``ProcessInfo``, from
    /// ``commands.list``).
    ProcessInfo {
        /// Its id: what ``commands.connect``, ``kill`` and the ``pty`` calls take.
        pid: u64,
        /// Its process id inside the sandbox.
        os_pid: u32,
        /// The program (a session run: its script).
        cmd: String,
        args: Py<PyTuple>,
        cwd: String,
        /// The shell session it runs in, if any.
        session: Option<String>,
        /// Under a pseudo-terminal (``pty.create``).
        tty: bool,
        /// Still running; ``commands.list(all=True)`` also lists ended ones.
        running: bool,
        /// Seconds since it started.
        age: f64,
        /// Output bytes so far, stdout and stderr together.
        output_bytes: u64,
    }
}

impl ProcessInfo {
    /// What the agent says of one command.
    pub fn of(py: Python<'_>, exec: &ExecSummary) -> PyResult<Self> {
        let (cmd, args) = match exec.argv.split_first() {
            Some((cmd, args)) => (cmd.clone(), args),
            None => (String::new(), &[][..]),
        };
        // Milliseconds are exact in an f64 for some 280 000 years.
        #[allow(clippy::cast_precision_loss, reason = "exact in this range")]
        let age = exec.age_ms as f64 / 1000.0;
        Ok(Self {
            pid: exec.exec_id,
            os_pid: exec.pid,
            cmd,
            args: words(py, args)?,
            cwd: exec.cwd.clone(),
            session: exec.session.clone(),
            tty: exec.tty,
            running: exec.state == ExecState::Running,
            age,
            output_bytes: exec.output_bytes,
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<CommandResult>()?;
    module.add_class::<Stdout>()?;
    module.add_class::<Stderr>()?;
    module.add_class::<Lost>()?;
    module.add_class::<Exit>()?;
    module.add_class::<SessionInfo>()?;
    module.add_class::<ProcessInfo>()
}
