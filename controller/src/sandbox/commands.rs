//! Commands in one sandbox: run to the end, or spawn and follow an
//! [`Execution`] that survives a dropped connection.
//!
//! The agent numbers every output byte of an exec and keeps the newest in a
//! ring. An [`Execution`] remembers the offset up to which it has handed
//! bytes on; when its connection dies, or the agent skipped frames this
//! client was too slow to take, it opens a new connection and attaches from
//! that offset. Replayed bytes it already delivered are trimmed, so each
//! byte reaches the caller once; bytes the ring no longer held are reported
//! as [`CommandEvent::Lost`] with their exact count, never silently.

use std::time::Duration;

use silo_protocol::exec::{
    Channel, ExecId, ExecSpec, ExecState, ExecSummary, ExitInfo, StreamOffsets, WindowSize,
};
use silo_protocol::session::SessionInfo;

use crate::client::{AgentClient, ClientError, ExecConnection, ExecEvent, ExecHandle};
use crate::retry::Backoff;

/// Re-attach attempts in a row, without a byte of progress, before giving up.
const MAX_REATTACH_IN_A_ROW: u32 = 5;
/// How long re-attaching keeps trying while a provider's proxy answers
/// 502-504: an E2B sandbox being paused and resumed cuts every connection
/// and its proxy answers 502 until it is back, which is not the agent gone.
const REATTACH_PROXY_BUSY_BUDGET: Duration = Duration::from_secs(60);
/// Pause between re-attach attempts the proxy answered busy.
const REATTACH_PROXY_BUSY_PAUSE: Duration = Duration::from_millis(250);
/// Pauses between re-attach attempts: 50 ms, doubled after each failure
/// (no cap: [`MAX_REATTACH_IN_A_ROW`] bounds them).
const REATTACH_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(50),
    max: Duration::MAX,
};

/// What an [`Execution`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandEvent {
    /// Output bytes, never delivered before.
    Output {
        /// stdout or stderr (a PTY's output is stdout).
        channel: Channel,
        /// Offset of `data[0]` in the exec's output (both channels count).
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Output the agent no longer held when this client came back for it.
    Lost {
        /// Offset of the first lost byte.
        offset: u64,
        /// How many bytes.
        bytes: u64,
    },
    /// The command ended; nothing follows.
    Exit(ExitInfo),
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// Bytes that could not be recovered after a lost connection.
    pub lost_bytes: u64,
    /// How it ended.
    pub exit: ExitInfo,
}

/// The commands of one sandbox, through its agent.
#[derive(Debug, Clone)]
pub struct Commands {
    client: AgentClient,
}

impl Commands {
    /// Commands through `client` (a sandbox's, or any agent's).
    pub fn new(client: AgentClient) -> Self {
        Self { client }
    }

    /// Runs a command to its end and collects its output, re-attaching
    /// after a lost connection like [`Commands::spawn`].
    pub async fn run(&self, spec: ExecSpec) -> Result<CommandOutput, ClientError> {
        self.spawn(spec).await?.collect().await
    }

    /// Starts a command and follows it from its first byte.
    ///
    /// Unless `spec.detach_timeout_ms` says otherwise, the agent interrupts
    /// the command once no client has followed it for its detach timeout,
    /// so a harness that dies does not leave it running for ever.
    pub async fn spawn(&self, spec: ExecSpec) -> Result<Execution, ClientError> {
        self.spawn_on(self.client.connect().await?, spec).await
    }

    /// [`Commands::spawn`] on a connection the caller already opened (and
    /// so could explain a failure to open); later connections are its own.
    pub async fn spawn_on(
        &self,
        connection: ExecConnection,
        spec: ExecSpec,
    ) -> Result<Execution, ClientError> {
        let handle = connection.exec(spec).await?;
        let mut execution = Execution::new(self.client.clone(), connection, handle, 0);
        execution.streams = Some(StreamOffsets::default());
        Ok(execution)
    }

    /// Follows a command started earlier (by this process or another), from
    /// output offset `from` (0 for everything the agent still holds).
    pub async fn attach(&self, exec_id: ExecId, from: u64) -> Result<Execution, ClientError> {
        let connection = self.client.connect().await?;
        let attached = connection.attach_from(exec_id, from, None).await?;
        let mut execution = Execution::new(self.client.clone(), connection, attached.handle, from);
        execution.note_lost(attached.lost_bytes);
        execution.streams = attached.streams;
        Ok(execution)
    }

    /// Follows a command from where each stream stands for the caller:
    /// `have` bytes of stdout and of stderr already seen. Output arrives
    /// from the next byte of each; what the agent no longer holds of them
    /// comes first, as one [`CommandEvent::Lost`] just before the first
    /// replayed byte.
    pub async fn attach_streams(
        &self,
        exec_id: ExecId,
        have: StreamOffsets,
    ) -> Result<Execution, ClientError> {
        let connection = self.client.connect().await?;
        let attached = connection.attach_from(exec_id, 0, Some(have)).await?;
        let streams = attached.streams.ok_or_else(|| {
            ClientError::Protocol("the agent did not say where each stream stands".into())
        })?;
        let from = attached.next_offset.saturating_sub(attached.lost_bytes);
        let mut execution = Execution::new(self.client.clone(), connection, attached.handle, from);
        execution.note_lost(attached.lost_bytes);
        execution.streams = Some(streams);
        execution.floor = have;
        Ok(execution)
    }

    /// Every command the agent holds, running and finished (for a while
    /// after they end), by id.
    pub async fn list(&self) -> Result<Vec<ExecSummary>, ClientError> {
        self.client.connect().await?.list().await
    }

    /// Interrupts a command: SIGINT to its process group, `grace` (the
    /// agent's default when `None`), then SIGKILL.
    pub async fn interrupt(
        &self,
        exec_id: ExecId,
        grace: Option<Duration>,
    ) -> Result<ExecState, ClientError> {
        self.client.connect().await?.interrupt(exec_id, grace).await
    }

    /// The shell sessions of the sandbox.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, ClientError> {
        self.client.connect().await?.list_sessions().await
    }
}

/// One running command, followed across dropped connections.
pub struct Execution {
    client: AgentClient,
    connection: ExecConnection,
    handle: ExecHandle,
    /// Offset up to which output has been handed to the caller.
    delivered: u64,
    /// Lost bytes noticed at the last attach, not yet reported.
    pending_lost: u64,
    /// Each stream's bytes up to `delivered`, when the agent says.
    streams: Option<StreamOffsets>,
    /// Each stream's bytes the caller had before it attached: not handed
    /// on again.
    floor: StreamOffsets,
    /// The exit, once seen.
    finished: bool,
}

impl Execution {
    fn new(
        client: AgentClient,
        connection: ExecConnection,
        handle: ExecHandle,
        delivered: u64,
    ) -> Self {
        Self {
            client,
            connection,
            handle,
            delivered,
            pending_lost: 0,
            streams: None,
            floor: StreamOffsets::default(),
            finished: false,
        }
    }

    /// The agent's id of the command (for [`Commands::attach`] from elsewhere).
    pub fn id(&self) -> ExecId {
        self.handle.id()
    }

    /// Offset up to which output has been delivered (and, after a loss,
    /// skipped).
    pub fn offset(&self) -> u64 {
        self.delivered
    }

    /// Each stream's bytes delivered (or skipped) so far, for
    /// [`Commands::attach_streams`] from elsewhere; `None` when the agent
    /// (older than protocol 8) does not say.
    pub fn streams(&self) -> Option<StreamOffsets> {
        self.streams
    }

    /// The next event; `Ok(None)` after the exit. An error means the agent
    /// could not be reached again (the sandbox stopped, or the agent died).
    pub async fn next(&mut self) -> Result<Option<CommandEvent>, ClientError> {
        if self.finished {
            return Ok(None);
        }
        let mut attempts = 0;
        loop {
            if let Some(lost) = self.take_lost() {
                return Ok(Some(lost));
            }
            match self.handle.next_event().await {
                Some(ExecEvent::Exit(exit)) => {
                    self.finished = true;
                    return Ok(Some(CommandEvent::Exit(exit)));
                }
                // The agent skipped frames this connection was too slow to
                // take: fetch them again from its ring.
                Some(ExecEvent::Output { offset, .. }) if offset > self.delivered => {
                    self.reattach(&mut attempts).await?;
                }
                Some(ExecEvent::Output {
                    channel,
                    offset,
                    data,
                }) => {
                    let skip = usize::try_from(self.delivered - offset).unwrap_or(usize::MAX);
                    let Some(fresh) = data.get(skip..).filter(|d| !d.is_empty()) else {
                        continue;
                    };
                    let offset = self.delivered;
                    self.delivered += fresh.len() as u64;
                    let had = self.counted(channel, fresh.len());
                    let Some(fresh) = fresh.get(had..).filter(|d| !d.is_empty()) else {
                        continue;
                    };
                    return Ok(Some(CommandEvent::Output {
                        channel,
                        offset: offset + had as u64,
                        data: fresh.to_vec(),
                    }));
                }
                None => self.reattach(&mut attempts).await?,
            }
        }
    }

    /// Reads to the exit and returns everything printed.
    pub async fn collect(mut self) -> Result<CommandOutput, ClientError> {
        let mut out = CommandOutput::default();
        while let Some(event) = self.next().await? {
            match event {
                CommandEvent::Output {
                    channel: Channel::Stderr,
                    data,
                    ..
                } => out.stderr.extend(data),
                CommandEvent::Output { data, .. } => out.stdout.extend(data),
                CommandEvent::Lost { bytes, .. } => out.lost_bytes += bytes,
                CommandEvent::Exit(exit) => out.exit = exit,
            }
        }
        Ok(out)
    }

    /// Sends bytes to the command's stdin (started with `stdin: true`).
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ClientError> {
        self.handle.write_stdin(data).await
    }

    /// Closes the command's stdin, so it reads EOF.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.handle.close_stdin().await
    }

    /// Changes the window of a PTY command.
    pub async fn resize(&self, window: WindowSize) -> Result<(), ClientError> {
        self.handle.resize(window).await
    }

    /// Interrupts the command: SIGINT, `grace`, SIGKILL. Its exit still
    /// arrives through [`Execution::next`].
    pub async fn interrupt(&self, grace: Option<Duration>) -> Result<ExecState, ClientError> {
        self.connection.interrupt(self.handle.id(), grace).await
    }

    /// Counts `len` more bytes of `channel`; answers how many of them the
    /// caller had before it attached.
    fn counted(&mut self, channel: Channel, len: usize) -> usize {
        let Some(streams) = &mut self.streams else {
            return 0;
        };
        let (count, floor) = match channel {
            Channel::Stderr => (&mut streams.stderr, self.floor.stderr),
            _ => (&mut streams.stdout, self.floor.stdout),
        };
        let had = floor.saturating_sub(*count).min(len as u64);
        *count += len as u64;
        usize::try_from(had).unwrap_or(len)
    }

    fn note_lost(&mut self, lost: u64) {
        self.pending_lost += lost;
    }

    fn take_lost(&mut self) -> Option<CommandEvent> {
        if self.pending_lost == 0 {
            return None;
        }
        let event = CommandEvent::Lost {
            offset: self.delivered,
            bytes: self.pending_lost,
        };
        self.delivered += self.pending_lost;
        self.pending_lost = 0;
        Some(event)
    }

    /// A new connection, attached from the last delivered byte. `attempts`
    /// counts the attempts since the last delivered event, failed or not,
    /// so a connection that keeps dying before any progress ends in an error.
    async fn reattach(&mut self, attempts: &mut u32) -> Result<(), ClientError> {
        let exec_id = self.handle.id();
        let busy_until = tokio::time::Instant::now() + REATTACH_PROXY_BUSY_BUDGET;
        loop {
            if *attempts >= MAX_REATTACH_IN_A_ROW {
                return Err(ClientError::Disconnected);
            }
            *attempts += 1;
            let attempt = async {
                let connection = self.client.connect().await?;
                let attached = connection
                    .attach_from(exec_id, self.delivered, None)
                    .await?;
                Ok::<_, ClientError>((connection, attached))
            };
            match attempt.await {
                Ok((connection, attached)) => {
                    let lost = attached.lost_bytes;
                    tracing::debug!(exec_id, from = self.delivered, lost, "re-attached");
                    self.connection = connection;
                    self.handle = attached.handle;
                    self.note_lost(lost);
                    // Counts kept across a gap only when the agent says
                    // where each stream stands after it.
                    self.streams = attached.streams.or(self.streams.filter(|_| lost == 0));
                    return Ok(());
                }
                // A proxy in front of a pausing or resuming VM: waited out
                // without counting against the attempts.
                Err(ClientError::Rejected { status, .. })
                    if matches!(status, 502..=504) && tokio::time::Instant::now() < busy_until =>
                {
                    *attempts -= 1;
                    tokio::time::sleep(REATTACH_PROXY_BUSY_PAUSE).await;
                }
                Err(error) if *attempts >= MAX_REATTACH_IN_A_ROW => return Err(error),
                Err(error) => {
                    tracing::debug!(exec_id, %error, "re-attach failed; trying again");
                    tokio::time::sleep(REATTACH_BACKOFF.pause(*attempts - 1)).await;
                }
            }
        }
    }
}
