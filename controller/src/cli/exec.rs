//! `silo exec`: run one command in a sandbox, stream its output, exit with its code.
//!
//! Ctrl-C never reaches the sandbox as a signal (its processes are in sessions
//! of their own); this process catches it and asks the agent, in band, to
//! interrupt the command: the first Ctrl-C with the agent's default grace, a
//! second within [`DOUBLE_TAP`] at once. A connection lost mid-command, or
//! one that fell behind and had output dropped, is re-attached and replayed
//! from the last byte shown, so output is lost only if the agent's ring no
//! longer holds it (and then the count is reported).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use silo::Silo;
use silo::client::{AgentClient, ExecConnection, ExecEvent, ExecHandle};
use silo_protocol::exec::{Channel, ExecSpec, ExitInfo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

/// A second Ctrl-C within this window kills without grace.
const DOUBLE_TAP: Duration = Duration::from_secs(1);
/// The agent kills a command whose client has been gone this long; this CLI
/// is its only client, and nothing re-attaches once this process is dead.
const DETACH_TIMEOUT: Duration = Duration::from_secs(60);
/// Re-attach attempts after a lost connection before giving up.
const MAX_REATTACH: u32 = 3;
/// Bytes read from local stdin per frame.
const STDIN_CHUNK: usize = 64 * 1024;
/// The shell's exit code for a command killed by SIGPIPE, used when our own
/// stdout goes away (`silo exec … | head`).
const BROKEN_PIPE_CODE: i32 = 128 + 13;

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
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(super) command: Vec<String>,
}

pub async fn run(silo: &Silo, args: Args) -> anyhow::Result<i32> {
    let spec = ExecSpec {
        argv: args.command,
        cwd: args.cwd,
        env: args.env.into_iter().collect(),
        stdin: args.stdin,
        timeout_ms: args.timeout.map(seconds_to_ms).transpose()?,
        detach_timeout_ms: Some(DETACH_TIMEOUT.as_millis() as u64),
        ..ExecSpec::default()
    };
    let sandbox = silo.get(&args.sandbox)?;
    let connection = silo.connect(&sandbox).await?;
    let client = silo.client(&sandbox)?;
    let handle = connection
        .exec(spec)
        .await
        .context("starting the command")?;
    let stdin = args.stdin.then(tokio::io::stdin);
    let mut session = Session {
        client,
        connection,
        handle,
        shown: 0,
    };
    let exit = match session.pump(stdin).await? {
        Some(exit) => exit,
        None => return Ok(BROKEN_PIPE_CODE),
    };
    if exit.timed_out {
        eprintln!("silo: command timed out");
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

/// One running command and what has been shown of it.
struct Session {
    client: AgentClient,
    connection: ExecConnection,
    handle: ExecHandle,
    /// Output offset up to which bytes have been written locally.
    shown: u64,
}

impl Session {
    /// Forwards output, stdin and Ctrl-C until the command exits. `None`
    /// means our stdout closed, and the command was killed.
    async fn pump(
        &mut self,
        mut stdin: Option<impl AsyncRead + Unpin>,
    ) -> anyhow::Result<Option<ExitInfo>> {
        let mut interrupts = signal(SignalKind::interrupt()).context("catching Ctrl-C")?;
        let mut last_interrupt: Option<Instant> = None;
        let mut reattached = 0;
        let mut buf = vec![0u8; STDIN_CHUNK];
        let mut stdout = tokio::io::stdout();
        let mut stderr = tokio::io::stderr();
        loop {
            tokio::select! {
                event = self.handle.next_event() => match event {
                    Some(ExecEvent::Exit(exit)) => return Ok(Some(exit)),
                    Some(ExecEvent::Output { seq, .. }) if seq > self.shown => {
                        // The agent dropped output this connection was too slow
                        // to take; replay it from the agent's ring.
                        self.reattach().await?;
                    }
                    Some(ExecEvent::Output { channel, seq, data }) => {
                        let out: &mut (dyn AsyncWrite + Unpin) = match channel {
                            Channel::Stderr => &mut stderr,
                            _ => &mut stdout,
                        };
                        if let Err(error) = self.show(out, seq, &data).await {
                            if error.kind() == std::io::ErrorKind::BrokenPipe {
                                // Nobody reads the output any more: stop the command.
                                let id = self.handle.id();
                                let _ = self.connection.interrupt(id, Some(Duration::ZERO)).await;
                                return Ok(None);
                            }
                            return Err(error).context("writing the command's output");
                        }
                    }
                    None => {
                        reattached += 1;
                        if reattached > MAX_REATTACH {
                            bail!("lost the connection to the agent {MAX_REATTACH} times; giving up");
                        }
                        self.reattach().await?;
                    }
                },
                Some(()) = interrupts.recv() => {
                    let now = Instant::now();
                    let grace = match last_interrupt {
                        Some(at) if now.duration_since(at) < DOUBLE_TAP => Some(Duration::ZERO),
                        _ => None,
                    };
                    last_interrupt = Some(now);
                    self.interrupt(grace);
                }
                read = read_some(&mut stdin, &mut buf), if stdin.is_some() => match read {
                    Ok(0) | Err(_) => {
                        stdin = None;
                        self.handle.close_stdin().await.context("closing the command's stdin")?;
                    }
                    Ok(n) => self.handle.write_stdin(&buf[..n]).await.context("forwarding stdin")?,
                },
            }
        }
    }

    /// Writes the part of a frame not shown yet (a replay may overlap).
    async fn show(
        &mut self,
        out: &mut (dyn AsyncWrite + Unpin),
        seq: u64,
        data: &[u8],
    ) -> std::io::Result<()> {
        let skip = usize::try_from(self.shown.saturating_sub(seq)).unwrap_or(usize::MAX);
        let Some(fresh) = data.get(skip..).filter(|d| !d.is_empty()) else {
            return Ok(());
        };
        out.write_all(fresh).await?;
        out.flush().await?;
        self.shown = seq.saturating_add(data.len() as u64);
        Ok(())
    }

    /// Opens a new connection and follows the command from the last byte shown.
    async fn reattach(&mut self) -> anyhow::Result<()> {
        let exec_id = self.handle.id();
        tracing::debug!(exec_id, from = self.shown, "re-attaching to the command");
        let connection = self
            .client
            .connect()
            .await
            .context("reconnecting to the agent")?;
        let (handle, lost) = connection
            .attach(exec_id, self.shown)
            .await
            .context("re-attaching to the command")?;
        if lost > 0 {
            eprintln!("silo: {lost} bytes of output were lost (no longer held by the agent)");
            self.shown = self.shown.saturating_add(lost);
        }
        self.connection = connection;
        self.handle = handle;
        Ok(())
    }

    /// Sends the interrupt without waiting for its answer, so output keeps flowing.
    fn interrupt(&self, grace: Option<Duration>) {
        let connection = self.connection.clone();
        let exec_id = self.handle.id();
        tokio::spawn(async move {
            if let Err(error) = connection.interrupt(exec_id, grace).await {
                eprintln!("silo: interrupting the command failed: {error}");
            }
        });
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
