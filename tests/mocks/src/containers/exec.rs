//! Processes in a sandbox's container, through `docker exec`.
//!
//! [`Container::spawn`] starts a process the way an in-VM daemon would
//! (`fork`, `chdir`, `execve`) and learns its pid *inside* the container:
//! a fixed shim script changes directory, checks the program, prints its
//! own pid on stdout and `exec`s the program, so the pid is the program's.
//! The engine only knows host pids, and those are not what a client sees.
//! Output streams as the engine delivers it (one stream on a terminal,
//! [`SpawnRequest::tty`], resized with [`Container::resize`]); the exit
//! code comes from the exec's inspection once its streams end. Signals go through the
//! container's own `kill`, to one process ([`Container::signal`]) or to a
//! process tree found by `/proc` parent links ([`Container::signal_tree`],
//! [`Container::terminate_tree`]): the engine cannot see inside.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWrite;

use super::{Container, ContainerError, engine};

/// The shim: `$1` is the working directory, the rest the program and its
/// arguments. Its first stdout line is `P<pid>`, or a letter saying why it
/// did not start: `C` no such directory, `E` no such program, `X` not
/// executable.
const SHIM: &str = r#"cd "$1" 2>/dev/null || { echo C; exit 1; }
shift
case "$1" in
  */*) [ -e "$1" ] || { echo E; exit 1; }; [ -f "$1" ] && [ -x "$1" ] || { echo X; exit 1; } ;;
  *) command -v "$1" >/dev/null 2>&1 || { echo E; exit 1; } ;;
esac
echo "P$$"
exec "$@""#;
/// Signals a process, its group and every descendant found by `/proc`
/// parent links: `$1` is the signal name, `$2` the pid. Prints the tree's
/// pids (the pid first), whether or not they were still there to signal.
const SIGNAL_TREE: &str = r#"sig=$1; root=$2
pairs=$(for s in /proc/[0-9]*/stat; do
  read -r l < "$s" 2>/dev/null || continue
  r="${l##*) }"; set -- $r; p=${s#/proc/}; echo "${p%/stat} $2"
done)
tree=$root; frontier=$root
while [ -n "$frontier" ]; do
  next=
  for f in $frontier; do
    next="$next $(echo "$pairs" | while read -r c pp; do [ "$pp" = "$f" ] && echo "$c"; done)"
  done
  frontier=$(echo $next)
  tree="$tree $frontier"
done
kill -s "$sig" -- "-$root" 2>/dev/null
kill -s "$sig" $tree 2>/dev/null
echo $tree"#;
/// Prints which of the pids given as arguments are alive (zombies count as gone).
const ALIVE: &str = r#"for p; do
  read -r l < "/proc/$p/stat" 2>/dev/null || continue
  r="${l##*) }"; [ "${r%% *}" = Z ] || echo "$p"
done"#;
/// How often [`Container::terminate_tree`] looks whether the tree is gone.
const TERMINATE_POLL: Duration = Duration::from_millis(100);
/// Longest wait for the shim's first line (the container may be frozen).
const SPAWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between looks at an exec whose streams ended but that the engine
/// still reports running.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// Longest wait for the engine to record an exit code after the streams end.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What to start.
pub struct SpawnRequest {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment added to the container's.
    pub env: Vec<(String, String)>,
    /// Working directory (absolute).
    pub cwd: String,
    /// Keep the process's stdin open (as a pipe nobody writes to until
    /// [`Spawned::input`] is used) instead of `/dev/null`.
    pub stdin: bool,
    /// Run it on a terminal (the engine's pseudo-TTY): stdout and stderr
    /// become one stream, reported as [`Output::Stdout`], and its size is
    /// set with [`Container::resize`].
    pub tty: bool,
    /// The terminal's size from the start (columns, rows), so the
    /// program never sees it unset.
    pub size: Option<(u16, u16)>,
}

/// Why a process did not start although the engine is fine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotStarted {
    /// The working directory does not exist.
    NoDirectory,
    /// The program was not found.
    NoProgram,
    /// The program is not an executable file.
    NotExecutable,
}

/// One chunk of a process's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Bytes on stdout.
    Stdout(Bytes),
    /// Bytes on stderr.
    Stderr(Bytes),
}

type OutputStream = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// A running process.
pub struct Spawned {
    /// Its pid inside the container.
    pub pid: u32,
    /// The engine's exec id (for the exit code).
    pub exec_id: String,
    /// Its stdin, if it was asked for.
    pub input: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    pending: VecDeque<Output>,
    output: OutputStream,
}

impl Spawned {
    /// The next chunk of output; `None` once both streams closed.
    pub async fn next(&mut self) -> Option<Result<Output, ContainerError>> {
        if let Some(chunk) = self.pending.pop_front() {
            return Some(Ok(chunk));
        }
        loop {
            match self.output.next().await? {
                Ok(LogOutput::StdOut { message }) => return Some(Ok(Output::Stdout(message))),
                Ok(LogOutput::StdErr { message }) => return Some(Ok(Output::Stderr(message))),
                // A terminal's one stream.
                Ok(LogOutput::Console { message }) => return Some(Ok(Output::Stdout(message))),
                Ok(_) => continue,
                Err(error) => return Some(Err(engine("read a process's output")(error))),
            }
        }
    }
}

/// Everything a finished process printed.
#[derive(Debug, Default)]
pub struct Finished {
    /// Exit code as the engine reports it.
    pub code: i64,
    /// Stdout.
    pub stdout: Vec<u8>,
    /// Stderr.
    pub stderr: Vec<u8>,
}

impl Container {
    /// Starts a process; `Ok(Err(_))` when the shim refused to start it.
    pub async fn spawn(
        &self,
        request: SpawnRequest,
    ) -> Result<Result<Spawned, NotStarted>, ContainerError> {
        let mut cmd = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            SHIM.to_owned(),
            "shim".to_owned(),
            request.cwd,
        ];
        cmd.extend(request.argv);
        let env: Vec<String> = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let terminal = request.tty.then_some(request.size);
        let (exec_id, output, input) = self.start_exec(cmd, env, request.stdin, terminal).await?;
        let mut spawned = Spawned {
            pid: 0,
            exec_id,
            input: request.stdin.then_some(input),
            pending: VecDeque::new(),
            output,
        };
        let line = tokio::time::timeout(SPAWN_TIMEOUT, control_line(&mut spawned, &self.id))
            .await
            .map_err(|_| ContainerError::Missing {
                what: "a started process's pid in time".to_owned(),
                container: self.id.clone(),
            })??;
        match line.as_str() {
            "C" => return Ok(Err(NotStarted::NoDirectory)),
            "E" => return Ok(Err(NotStarted::NoProgram)),
            "X" => return Ok(Err(NotStarted::NotExecutable)),
            _ => {}
        }
        spawned.pid = line
            .strip_prefix('P')
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| ContainerError::Missing {
                what: format!("a pid in the shim's line {line:?}"),
                container: self.id.clone(),
            })?;
        Ok(Ok(spawned))
    }

    /// The exit code of a finished exec (its streams have ended).
    pub async fn exit_code(&self, exec_id: &str) -> Result<i64, ContainerError> {
        let deadline = tokio::time::Instant::now() + EXIT_TIMEOUT;
        loop {
            let inspected = self
                .docker
                .inspect_exec(exec_id)
                .await
                .map_err(engine(format!("inspect exec {exec_id}")))?;
            if let (false, Some(code)) = (inspected.running == Some(true), inspected.exit_code) {
                return Ok(code);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ContainerError::Missing {
                    what: format!("the exit code of exec {exec_id}"),
                    container: self.id.clone(),
                });
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// Sets the terminal size of an exec started with [`SpawnRequest::tty`].
    pub async fn resize(
        &self,
        exec_id: &str,
        width: u16,
        height: u16,
    ) -> Result<(), ContainerError> {
        self.docker
            .resize_exec(exec_id, ResizeExecOptions { height, width })
            .await
            .map_err(engine(format!("resize exec {exec_id}")))
    }

    /// Runs `argv` to the end and collects its output.
    pub async fn run(&self, argv: &[&str]) -> Result<Finished, ContainerError> {
        let cmd = argv.iter().map(|s| (*s).to_owned()).collect();
        let (exec_id, mut output, _input) = self.start_exec(cmd, Vec::new(), false, None).await?;
        let mut finished = Finished::default();
        while let Some(chunk) = output.next().await {
            match chunk.map_err(engine("read a command's output"))? {
                LogOutput::StdOut { message } => finished.stdout.extend_from_slice(&message),
                LogOutput::StdErr { message } => finished.stderr.extend_from_slice(&message),
                _ => {}
            }
        }
        finished.code = self.exit_code(&exec_id).await?;
        Ok(finished)
    }

    /// Sends `signal` (a name such as `KILL`) to `pid` in the container;
    /// false if no such process was there to signal.
    pub async fn signal(&self, pid: u32, signal: &str) -> Result<bool, ContainerError> {
        let pid = pid.to_string();
        let finished = self
            .run(&[
                "/bin/sh",
                "-c",
                "kill -s \"$1\" \"$2\" 2>/dev/null",
                "signal",
                signal,
                &pid,
            ])
            .await?;
        Ok(finished.code == 0)
    }

    /// Sends `signal` to `pid`, its process group and all its descendants;
    /// returns the pids of the tree (`pid` first) as it was found.
    pub async fn signal_tree(&self, pid: u32, signal: &str) -> Result<Vec<u32>, ContainerError> {
        let pid = pid.to_string();
        let finished = self
            .run(&["/bin/sh", "-c", SIGNAL_TREE, "signal-tree", signal, &pid])
            .await?;
        Ok(pids_of(&finished.stdout))
    }

    /// Which of `pids` are still running (zombies count as gone).
    pub async fn alive(&self, pids: &[u32]) -> Result<Vec<u32>, ContainerError> {
        if pids.is_empty() {
            return Ok(Vec::new());
        }
        let texts: Vec<String> = pids.iter().map(u32::to_string).collect();
        let mut argv = vec!["/bin/sh", "-c", ALIVE, "alive"];
        argv.extend(texts.iter().map(String::as_str));
        Ok(pids_of(&self.run(&argv).await?.stdout))
    }

    /// Ends `pid` and its descendants as a daemon ends a session: SIGTERM to
    /// the group and the tree, up to `grace` for them to go, then SIGKILL to
    /// what is left.
    pub async fn terminate_tree(&self, pid: u32, grace: Duration) -> Result<(), ContainerError> {
        let tree = self.signal_tree(pid, "TERM").await?;
        let deadline = tokio::time::Instant::now() + grace;
        let mut left = self.alive(&tree).await?;
        while !left.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(TERMINATE_POLL).await;
            left = self.alive(&left).await?;
        }
        if !left.is_empty() {
            self.signal_tree(pid, "KILL").await?;
            let texts: Vec<String> = left.iter().map(u32::to_string).collect();
            let mut argv = vec!["/bin/sh", "-c", "kill -s KILL \"$@\" 2>/dev/null", "kill"];
            argv.extend(texts.iter().map(String::as_str));
            self.run(&argv).await?;
        }
        Ok(())
    }

    async fn start_exec(
        &self,
        cmd: Vec<String>,
        env: Vec<String>,
        stdin: bool,
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<(String, OutputStream, Pin<Box<dyn AsyncWrite + Send>>), ContainerError> {
        let tty = terminal.is_some();
        let options = ExecConfig {
            attach_stdin: Some(stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty),
            // The engine's order: rows, then columns.
            console_size: terminal
                .flatten()
                .map(|(columns, rows)| vec![usize::from(rows), usize::from(columns)]),
            env: Some(env),
            cmd: Some(cmd),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(&self.id, options)
            .await
            .map_err(engine(format!("create an exec in {}", self.id)))?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(engine(format!("start exec {}", created.id)))?;
        match started {
            StartExecResults::Attached { output, input } => Ok((created.id, output, input)),
            StartExecResults::Detached => Err(ContainerError::Missing {
                what: "an attached exec".to_owned(),
                container: self.id.clone(),
            }),
        }
    }
}

/// The pids in a script's whitespace-separated output.
fn pids_of(stdout: &[u8]) -> Vec<u32> {
    String::from_utf8_lossy(stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Reads the shim's first stdout line; output that arrives around it is
/// kept for the caller in order.
async fn control_line(spawned: &mut Spawned, container: &str) -> Result<String, ContainerError> {
    let mut line = Vec::new();
    loop {
        let Some(chunk) = spawned.output.next().await else {
            return Err(ContainerError::Missing {
                what: "the shim's first line before its output ended".to_owned(),
                container: container.to_owned(),
            });
        };
        match chunk.map_err(engine("read a starting process's output"))? {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                if let Some(end) = message.iter().position(|b| *b == b'\n') {
                    line.extend_from_slice(&message[..end]);
                    let rest = message.slice(end + 1..);
                    if !rest.is_empty() {
                        spawned.pending.push_back(Output::Stdout(rest));
                    }
                    // A terminal ends lines with CR LF.
                    let text = String::from_utf8_lossy(&line);
                    return Ok(text.trim_end_matches('\r').to_owned());
                }
                line.extend_from_slice(&message);
            }
            LogOutput::StdErr { message } => spawned.pending.push_back(Output::Stderr(message)),
            _ => {}
        }
    }
}
