//! `silo exec`: run one command in a sandbox, stream its output, exit with its code.
//!
//! Ctrl-C never reaches the sandbox as a signal (its processes are in sessions
//! of their own); this process catches it and asks the agent, in band, to
//! interrupt the command: the first Ctrl-C with the agent's default grace, a
//! second within [`DOUBLE_TAP`] at once. Output is followed through the
//! library's [`Execution`], which re-attaches after a lost connection and
//! replays from the last byte shown, so output is lost only if the agent's
//! ring no longer holds it (and then the count is reported).
//!
//! `--session ID` runs the command in a named shell session of the sandbox
//! (created on first use): cwd, exported variables and shell variables carry
//! over from one call to the next, whichever process makes it. One word is a
//! shell line (`-- 'cd /app && make'`); several words are a command and its
//! arguments, as without a session. Ctrl-C works as above; the session's
//! shell survives it.
//!
//! `-t` runs the command under a pseudo-terminal: this terminal goes raw (and
//! is restored on every way out), the remote window follows this one's size,
//! and Ctrl-C travels as the byte a terminal sends (0x03), for the remote
//! line discipline to turn into SIGINT. There is no second-Ctrl-C kill in a
//! PTY: interactive programs (a shell, python, vim) use Ctrl-C themselves.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use silo::Silo;
use silo::client::ClientError;
use silo::{CommandEvent, Commands, Execution};
use silo_protocol::exec::{Channel, ExecSpec, ExitInfo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::output::BROKEN_PIPE_CODE;
use super::terminal;

/// A second Ctrl-C within this window kills without grace.
const DOUBLE_TAP: Duration = Duration::from_secs(1);
/// Bytes read from local stdin per frame.
const STDIN_CHUNK: usize = 64 * 1024;
/// What a terminal sends for Ctrl-C.
const CTRL_C: u8 = 0x03;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name or id.
    sandbox: String,
    /// Working directory in the sandbox.
    #[arg(long)]
    cwd: Option<String>,
    /// Extra environment for the command.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    env: Vec<(String, String)>,
    /// Interrupt the command after this many seconds.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Forward this terminal's stdin to the command (closed otherwise).
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Run under a pseudo-terminal (with -i, for interactive programs).
    #[arg(short = 't', long, conflicts_with = "session")]
    tty: bool,
    /// Run in this shell session of the sandbox (created on first use); cwd
    /// and variables persist between calls. The words form one script.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// With --session: fail at once if the session is running another command.
    #[arg(long, requires = "session")]
    no_wait: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(super) command: Vec<String>,
}

pub async fn run(silo: &Silo, args: Args) -> anyhow::Result<i32> {
    let mut spec = ExecSpec {
        argv: args.command,
        cwd: args.cwd,
        env: args.env.into_iter().collect(),
        stdin: args.stdin,
        timeout_ms: args.timeout.map(seconds_to_ms).transpose()?,
        session: args.session,
        no_wait: args.no_wait,
        ..ExecSpec::default()
    };
    if args.tty {
        ask_for_terminal(&mut spec);
    }
    execute(silo, &args.sandbox, spec, args.stdin).await
}

/// Asks for a pseudo-terminal the size of this one, drawing for this one's `TERM`.
pub(super) fn ask_for_terminal(spec: &mut ExecSpec) {
    spec.tty = true;
    spec.window = terminal::window_size();
    spec.env
        .entry("TERM".to_owned())
        .or_insert_with(terminal::term);
}

/// Starts `spec` and follows it to its end, forwarding stdin when asked;
/// returns the exit code to leave with. Shared with `silo shell`.
pub(super) async fn execute(
    silo: &Silo,
    sandbox: &str,
    spec: ExecSpec,
    forward_stdin: bool,
) -> anyhow::Result<i32> {
    // No detach timeout is named: the agent's default interrupts the command
    // once this process, its only client, has been gone that long.
    let tty = spec.tty;
    let mut signals = Signals::catch(tty)?;
    let sandbox = silo.get(sandbox)?;
    let connection = silo.connect(&sandbox).await?;
    let commands = Commands::new(silo.client(&sandbox)?);
    let execution = match commands.spawn_on(connection, spec).await {
        Ok(execution) => execution,
        Err(err) => {
            // Not found and not executable end as a shell ends them: 127 and 126.
            if let ClientError::Agent { kind, message } = &err
                && let Some(code) = kind.shell_code()
            {
                eprintln!("silo: {message}");
                return Ok(code);
            }
            return Err(anyhow::Error::new(err).context("starting the command"));
        }
    };
    let raw = if tty && forward_stdin {
        terminal::RawMode::enter().context("putting the terminal in raw mode")?
    } else {
        None
    };
    let stdin = forward_stdin.then(tokio::io::stdin);
    let mut running = Running {
        commands,
        execution,
        tty,
    };
    let outcome = running.pump(&mut signals, stdin).await;
    // Notes below are plain lines again only once the terminal is back.
    drop(raw);
    let exit = match outcome? {
        Outcome::Exited(exit) => exit,
        Outcome::OutputClosed => return Ok(BROKEN_PIPE_CODE),
        Outcome::Signalled(code) => return Ok(code),
    };
    if exit.timed_out {
        eprintln!("silo: command timed out");
    }
    match exit.ended_by_rewind.as_deref() {
        Some("") => eprintln!("silo: ended by a rewind of the sandbox"),
        Some(snapshot) => eprintln!("silo: ended by a rewind to {snapshot}"),
        None => {}
    }
    if exit.restored {
        eprintln!(
            "silo: the session's shell had died; a new one was started with its last cwd and environment"
        );
    }
    Ok(exit.shell_code())
}

fn seconds_to_ms(secs: f64) -> anyhow::Result<u64> {
    let duration = Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--timeout {secs} is not a positive number of seconds"))?;
    Ok(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// The signals this process turns into requests. They are caught before the
/// command starts: uncaught, a Ctrl-C in that moment would kill this process
/// and leave the command running, unseen, until the detach timeout.
struct Signals {
    interrupt: Signal,
    /// PTY only: the local window changed.
    window_change: Option<Signal>,
    /// PTY only: without these the process would die with the terminal raw.
    terminate: Option<Signal>,
    hangup: Option<Signal>,
}

impl Signals {
    fn catch(tty: bool) -> anyhow::Result<Self> {
        let pty = |kind: SignalKind| -> anyhow::Result<Option<Signal>> {
            Ok(if tty {
                Some(signal(kind).context("catching terminal signals")?)
            } else {
                None
            })
        };
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("catching Ctrl-C")?,
            window_change: pty(SignalKind::window_change())?,
            terminate: pty(SignalKind::terminate())?,
            hangup: pty(SignalKind::hangup())?,
        })
    }
}

/// One running command.
struct Running {
    commands: Commands,
    execution: Execution,
    /// It runs under a pseudo-terminal.
    tty: bool,
}

/// How following a command ended.
enum Outcome {
    /// It exited.
    Exited(ExitInfo),
    /// Our stdout closed, and the command was killed.
    OutputClosed,
    /// This process was told to stop (PTY mode only); leave with this code.
    Signalled(i32),
}

impl Running {
    /// Forwards output, stdin, Ctrl-C and (PTY) window changes until the
    /// command exits.
    async fn pump(
        &mut self,
        signals: &mut Signals,
        mut stdin: Option<impl AsyncRead + Unpin>,
    ) -> anyhow::Result<Outcome> {
        let mut last_interrupt: Option<Instant> = None;
        let mut buf = vec![0u8; STDIN_CHUNK];
        let mut stdout = tokio::io::stdout();
        let mut stderr = tokio::io::stderr();
        loop {
            tokio::select! {
                event = self.execution.next() => match event.context("following the command")? {
                    None => bail!("the command's output ended without an exit"),
                    Some(CommandEvent::Exit(exit)) => return Ok(Outcome::Exited(exit)),
                    Some(CommandEvent::Lost { bytes, .. }) => {
                        eprintln!("silo: {bytes} bytes of output were lost (no longer held by the agent)");
                    }
                    Some(CommandEvent::Output { channel, data, .. }) => {
                        let out: &mut (dyn AsyncWrite + Unpin) = match channel {
                            Channel::Stderr => &mut stderr,
                            _ => &mut stdout,
                        };
                        if let Err(error) = show(out, &data).await {
                            if error.kind() == std::io::ErrorKind::BrokenPipe {
                                // Nobody reads the output any more: stop the command.
                                let _ = self.execution.interrupt(Some(Duration::ZERO)).await;
                                return Ok(Outcome::OutputClosed);
                            }
                            return Err(error).context("writing the command's output");
                        }
                    }
                },
                Some(()) = signals.interrupt.recv() => {
                    if self.tty {
                        // Raw mode turns Ctrl-C into input; this is a SIGINT
                        // from elsewhere, delivered the same way.
                        self.execution.write_stdin(&[CTRL_C]).await.context("forwarding Ctrl-C")?;
                        continue;
                    }
                    let now = Instant::now();
                    let grace = match last_interrupt {
                        Some(at) if now.duration_since(at) < DOUBLE_TAP => Some(Duration::ZERO),
                        _ => None,
                    };
                    last_interrupt = Some(now);
                    self.interrupt(grace);
                }
                Some(()) = next(&mut signals.window_change) => {
                    if let Some(window) = terminal::window_size() {
                        self.execution.resize(window).await.context("resizing the terminal")?;
                    }
                }
                Some(()) = next(&mut signals.terminate) => return Ok(Outcome::Signalled(128 + libc::SIGTERM)),
                Some(()) = next(&mut signals.hangup) => return Ok(Outcome::Signalled(128 + libc::SIGHUP)),
                read = read_some(&mut stdin, &mut buf), if stdin.is_some() => match read {
                    Ok(0) | Err(_) => {
                        stdin = None;
                        self.execution.close_stdin().await.context("closing the command's stdin")?;
                    }
                    Ok(n) => self.execution.write_stdin(&buf[..n]).await.context("forwarding stdin")?,
                },
            }
        }
    }

    /// Sends the interrupt without waiting for its answer, so output keeps flowing.
    fn interrupt(&self, grace: Option<Duration>) {
        let commands = self.commands.clone();
        let exec_id = self.execution.id();
        tokio::spawn(async move {
            if let Err(error) = commands.interrupt(exec_id, grace).await {
                eprintln!("silo: interrupting the command failed: {error}");
            }
        });
    }
}

/// Writes output as it comes.
async fn show(out: &mut (dyn AsyncWrite + Unpin), data: &[u8]) -> std::io::Result<()> {
    out.write_all(data).await?;
    out.flush().await
}

/// The next delivery of a signal that may not be watched at all.
async fn next(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

async fn read_some(
    stdin: &mut Option<impl AsyncRead + Unpin>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match stdin {
        Some(reader) => reader.read(buf).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_must_be_positive() {
        assert_eq!(seconds_to_ms(1.5).unwrap(), 1500);
        assert!(seconds_to_ms(0.0).is_err());
        assert!(seconds_to_ms(-1.0).is_err());
        assert!(seconds_to_ms(f64::NAN).is_err());
    }
}
