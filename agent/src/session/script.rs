//! The shell text the agent writes to a session's shell, and nothing else.
//!
//! Every line is plain POSIX shell, the same for bash, dash and busybox ash.
//! The protocol with the shell is out of band: the user's script never passes
//! through the shell's command line (it is sourced from a pipe, so it needs no
//! quoting and `return` ends it), its streams are per-run pipes, and the
//! shell's own stderr carries framed records back to the agent (parsed in
//! `report`): `S` when a run's line starts, `D`…`E` with its status,
//! exported environment and cwd when it ends normally, and `P` in the prompt,
//! which the shell prints whenever it is back at its command loop, including
//! after SIGINT aborted a run. Nothing of this reaches the run's own output.
//!
//! Records are framed by the ASCII record and unit separators (0x1e, 0x1f),
//! which neither prompts nor error messages contain.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use silo_protocol::exec::ExecId;

/// Starts a record.
pub const RS: u8 = 0x1e;
/// Ends a field.
pub const US: u8 = 0x1f;
/// Environment variable holding a shell's marker, so closing a session finds
/// everything started from it, escaped or not.
pub const SHELL_MARKER_VAR: &str = "SILO_SHELL";

/// Which dialect the shell's own commands need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// GNU bash: started with `--norc --noprofile --noediting -i`.
    Bash,
    /// Any other POSIX shell (dash, busybox ash): started with `-i`.
    Posix,
}

impl Flavor {
    /// The flags that make the shell interactive (so SIGINT aborts the running
    /// command and returns to the prompt instead of killing the shell) and
    /// keep it from reading startup files or a line editor from its stdin.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Self::Bash => &["--norc", "--noprofile", "--noediting", "-i"],
            Self::Posix => &["-i"],
        }
    }
}

pub use silo_protocol::session::quote;

/// The prompt: a `P` record naming the run (empty before the first one) and
/// the status of the last command.
fn prompt(run: Option<ExecId>) -> Vec<u8> {
    let mut ps1 = vec![RS, b'P'];
    if let Some(run) = run {
        ps1.extend_from_slice(run.to_string().as_bytes());
    }
    ps1.push(US);
    ps1.extend_from_slice(b"$?");
    ps1.push(US);
    let mut out = b"PS1=".to_vec();
    out.extend(quote(&ps1));
    out
}

/// Sets the shell up once, after any restore text: the prompt, no
/// continuation prompt, no history, mail checks or idle logout.
pub fn init(flavor: Flavor) -> Vec<u8> {
    let mut out = prompt(None);
    out.extend_from_slice(b"; PS2=; ");
    // `unset` of a read-only variable fails; it comes last so that cannot
    // cost the prompt.
    match flavor {
        Flavor::Bash => out.extend_from_slice(
            b"set +o history +H; unset PS0 PROMPT_COMMAND HISTFILE MAILCHECK MAIL MAILPATH TMOUT\n",
        ),
        Flavor::Posix => out.extend_from_slice(b"unset MAILCHECK MAIL MAILPATH TMOUT\n"),
    }
    out
}

/// Brings a fresh shell to a dead one's last known state: its exported
/// variables (the text its `export -p` printed, which is shell input by
/// design), this shell's own marker again, and its working directory.
pub fn restore(env: &[u8], cwd: &[u8], marker: &str) -> Vec<u8> {
    let mut out = env.to_vec();
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(
        format!("{SHELL_MARKER_VAR}={marker}; \\command export {SHELL_MARKER_VAR}\n").as_bytes(),
    );
    out.extend_from_slice(b"\\command cd -- ");
    out.extend(quote(cwd));
    out.push(b'\n');
    out
}

/// Where one run's descriptors are, as the agent holds them (the shell opens
/// them as `/proc/AGENT/fd/N`; they are pipes, so it gets the same pipe).
#[derive(Debug, Clone, Copy)]
pub struct RunFds {
    /// Read end of the pipe holding the script.
    pub script: RawFd,
    /// Read end of the stdin pipe; `/dev/null` when stdin is not attached.
    pub stdin: Option<RawFd>,
    /// Write end of the stdout pipe.
    pub stdout: RawFd,
    /// Write end of the stderr pipe.
    pub stderr: RawFd,
}

/// The one line that runs a script: set the prompt and the exec marker, say
/// `S`, source the script with the run's streams, then say `D`, the exported
/// environment and `E` with the cwd. If SIGINT aborts the line, the shell
/// drops the rest of it and prints the prompt, whose `P` record carries the
/// status instead.
pub fn run_line(agent_pid: u32, run: ExecId, fds: &RunFds) -> Vec<u8> {
    let fd = |n: RawFd| format!("/proc/{agent_pid}/fd/{n}");
    let stdin = fds.stdin.map_or_else(|| "/dev/null".to_owned(), fd);
    let mut out = prompt(Some(run));
    out.extend_from_slice(
        format!(
            "; {marker}={run}; \\command export {marker}; \
             \\command printf '\\036S%s\\037' {run} >&2; \
             \\command . {script} 0<{stdin} 1>{stdout} 2>{stderr}; \
             \\command printf '\\036D%s\\037%s\\037' {run} \"$?\" >&2; \
             \\command export -p >&2; \
             \\command printf '\\036E%s\\037' \"$PWD\" >&2\n",
            marker = crate::exec::EXEC_MARKER_VAR,
            script = fd(fds.script),
            stdout = fd(fds.stdout),
            stderr = fd(fds.stderr),
        )
        .as_bytes(),
    );
    out
}

/// A line that only answers with an `F` record: proof that the shell reads
/// its input again and no signal is still on its way to it.
pub fn fence(token: u64) -> Vec<u8> {
    format!("\\command printf '\\036F%s\\037' {token} >&2\n").into_bytes()
}

/// The user's script, after the spec's `env` and `cwd` (applied in the shell
/// so they persist). One word is a shell line as it stands; several words are
/// a command and its arguments, each quoted, so `sh -c 'echo $V'` means what
/// it means outside a session.
pub fn user_script(argv: &[String], cwd: Option<&[u8]>, env: &BTreeMap<String, String>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in env {
        // The whole `NAME=value` is one quoted word, so no name can inject code.
        out.extend_from_slice(b"\\command export ");
        out.extend(quote(format!("{name}={value}").as_bytes()));
        out.push(b'\n');
    }
    if let Some(cwd) = cwd {
        out.extend_from_slice(b"\\command cd -- ");
        out.extend(quote(cwd));
        out.extend_from_slice(b" || return\n");
    }
    match argv {
        [line] => out.extend_from_slice(line.as_bytes()),
        words => {
            for (i, word) in words.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend(quote(word.as_bytes()));
            }
        }
    }
    out.push(b'\n');
    out
}

/// The `-c` text of an interactive shell started from a session's state: the
/// session's exported variables (keeping this exec's own marker), the
/// client's variables (its `TERM`), its cwd, then the shell itself.
pub fn interactive(
    shell: &[u8],
    env: Option<&[u8]>,
    cwd: &[u8],
    client_env: &BTreeMap<String, String>,
) -> Vec<u8> {
    let marker = crate::exec::EXEC_MARKER_VAR;
    let mut out = format!("__silo_marker=${marker}\n").into_bytes();
    if let Some(env) = env {
        out.extend_from_slice(env);
        out.push(b'\n');
    }
    out.extend_from_slice(
        format!("{marker}=$__silo_marker; \\command export {marker}; unset __silo_marker {SHELL_MARKER_VAR}\n")
            .as_bytes(),
    );
    for (name, value) in client_env {
        out.extend_from_slice(b"\\command export ");
        out.extend(quote(format!("{name}={value}").as_bytes()));
        out.push(b'\n');
    }
    out.extend_from_slice(b"\\command cd -- ");
    out.extend(quote(cwd));
    out.extend_from_slice(b" 2>/dev/null\nexec ");
    out.extend(quote(shell));
    out.extend_from_slice(b" -i\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `text` with sh through the test reaper (a plain `output()` could
    /// lose its child's status to the reaper other tests run).
    fn sh(text: &[u8]) -> String {
        use std::io::Read;
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(std::ffi::OsStr::new(&*String::from_utf8_lossy(text)))
            .stdout(std::process::Stdio::piped());
        let (mut child, exit) = crate::reaper::test_reaper().spawn(&mut cmd).unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        exit.blocking_recv().unwrap();
        out
    }

    #[test]
    fn quoting_survives_every_awkward_byte() {
        let nasty = b"it's \"$HOME\" `id` $(id) \\ \n done";
        let mut text = b"printf %s ".to_vec();
        text.extend(quote(nasty));
        assert_eq!(sh(&text).as_bytes(), nasty);
    }

    #[test]
    fn env_names_cannot_inject_code() {
        let mut env = BTreeMap::new();
        env.insert("$(echo pwned)".to_owned(), "x".to_owned());
        env.insert("GOOD".to_owned(), "it's".to_owned());
        let text = user_script(&["echo \"$GOOD\"".to_owned()], None, &env);
        let out = sh(&text);
        assert_eq!(out, "it's\n");
    }

    #[test]
    fn one_word_is_a_line_and_several_are_a_command_with_arguments() {
        let env = BTreeMap::from([("V".to_owned(), "set".to_owned())]);
        let line = user_script(&["echo $V; echo two".to_owned()], None, &env);
        assert_eq!(sh(&line), "set\ntwo\n");
        let argv = ["sh", "-c", "echo \"$V\" \"it's\""].map(str::to_owned);
        assert_eq!(sh(&user_script(&argv, None, &env)), "set it's\n");
        let argv = ["echo", "$V", "a  b"].map(str::to_owned);
        assert_eq!(sh(&user_script(&argv, None, &env)), "$V a  b\n");
    }

    #[test]
    fn the_run_line_names_the_run_and_the_agent_descriptors() {
        let line = run_line(
            42,
            7,
            &RunFds {
                script: 10,
                stdin: None,
                stdout: 11,
                stderr: 12,
            },
        );
        let text = String::from_utf8_lossy(&line);
        assert!(
            text.starts_with("PS1='\u{1e}P7\u{1f}$?\u{1f}'; SILO_EXEC_ID=7;"),
            "{text}"
        );
        assert!(
            text.contains(
                "\\command . /proc/42/fd/10 0</dev/null 1>/proc/42/fd/11 2>/proc/42/fd/12;"
            )
        );
        assert!(text.ends_with("\"$PWD\" >&2\n") && text.matches('\n').count() == 1);
    }
}
