//! Starting one exec and seeing it through to its exit report.
//!
//! [`launch`] spawns the command through the reaper (new session, marker in
//! its environment, stdin closed unless asked for; `posix_spawn` for plain
//! execs, see [`crate::process::spawn`]) and hands it to a
//! supervisor task. The supervisor pumps stdout and stderr into the exec's
//! record, applies the timeout and the detach timeout, and after the leader
//! is reaped waits for the pipes to reach EOF, but no longer than [`LINGER`]:
//! a background child may hold them open forever, and the exit must still be
//! reported. Only then is the exit sent, after the last output frame.
//!
//! A PTY exec (`tty`) differs only in its streams: the child gets a
//! pseudo-terminal's slave for all three (see [`super::pty`]), and the
//! master carries both its output (as stdout) and its input.

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use silo_protocol::exec::{Channel, ExecId, ExecSpec};
use silo_protocol::limits::{MAX_FRAME_PAYLOAD, MAX_GRACE};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::unix::pipe;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};

use super::detach::{self, DetachTimer};
use super::pty;
use super::record::{ExecRecord, What};
use super::{EXEC_MARKER_VAR, ExecError, Inner, Subscriber};
use crate::process::{Scope, new_session, spawn};
use crate::reaper::ProcessExit;

/// How long after the leader exits the pipes may stay open before the exit is
/// reported anyway.
pub const LINGER: Duration = Duration::from_millis(100);
/// Stdin chunks queued per exec before a writer has to wait.
pub(super) const STDIN_QUEUE: usize = 16;
/// Stands in for "never" in deadlines that are not armed.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What the supervisor enforces.
struct Limits {
    timeout: Option<Duration>,
    grace: Duration,
    detach_after: Option<Duration>,
}

/// Spawns the command, registers it, and starts its supervisor.
pub(super) fn launch(
    inner: &Arc<Inner>,
    id: ExecId,
    spec: &ExecSpec,
    cwd: &Path,
    sub: Subscriber,
    permit: OwnedSemaphorePermit,
) -> Result<Arc<ExecRecord>, ExecError> {
    let program = spec.argv.first().map_or("", String::as_str);
    let (pid, output, stdin, exit_rx) = if spec.tty {
        let pty = pty::open(spec.window.unwrap_or_default()).map_err(ExecError::Pipes)?;
        let mut cmd = command(spec, cwd, id);
        pty::attach(&mut cmd, &pty.slave).map_err(ExecError::Pipes)?;
        let (child, exit_rx) = inner
            .reaper
            .spawn(&mut cmd)
            .map_err(|source| ExecError::spawn(program, source))?;
        // The child's copies are all it needs; the parent must not keep the
        // terminal open, or reading the master would never end.
        drop(cmd);
        drop(pty.slave);
        let reader = pty::Reader(Arc::clone(&pty.master));
        let writer = pty::Writer(pty.master);
        (
            child.id(),
            Output::Pty(reader),
            Some(Input::Pty(writer)),
            exit_rx,
        )
    } else {
        let marker = id.to_string();
        let request = spawn::SpawnRequest {
            argv: &spec.argv,
            cwd,
            env: spec
                .env
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                // Last, so a spec cannot hide a command from interrupt.
                .chain([(EXEC_MARKER_VAR, marker.as_str())])
                .collect(),
            stdin: spec.stdin,
        };
        let (child, exit_rx) = inner
            .reaper
            .spawn_with(|| spawn::spawn(&request), |child| child.pid)
            .map_err(|source| ExecError::spawn(program, source))?;
        let pid = child.pid;
        match pipes(child) {
            Ok((output, stdin)) => (pid, output, stdin, exit_rx),
            Err(err) => {
                inner
                    .ops
                    .signal_group(i32::try_from(pid).unwrap_or(0), Signal::SIGKILL);
                return Err(ExecError::Pipes(err));
            }
        }
    };
    let leader = i32::try_from(pid).unwrap_or(0);
    let scope = Scope {
        leader,
        marker: format!("{EXEC_MARKER_VAR}={id}"),
    };
    let (stdin_tx, stdin_rx) = match stdin {
        Some(input) => {
            let (tx, rx) = mpsc::channel(STDIN_QUEUE);
            (Some(tx), Some((input, rx)))
        }
        None => (None, None),
    };
    let mut record =
        ExecRecord::new(id, pid, scope, inner.new_ring(), sub, stdin_tx).with_what(What {
            argv: spec.argv.clone(),
            cwd: cwd.display().to_string(),
            session: None,
            tty: spec.tty,
        });
    if let Output::Pty(reader) = &output {
        record = record.with_pty(Arc::clone(&reader.0));
    }
    let record = Arc::new(record);
    if let Some((input, rx)) = stdin_rx {
        match input {
            Input::Pipe(pipe) => tokio::spawn(feed_stdin(pipe, rx, record.finished())),
            Input::Pty(writer) => tokio::spawn(feed_stdin(writer, rx, record.finished())),
        };
    }
    inner.insert(Arc::clone(&record));
    let limits = Limits {
        timeout: spec.timeout_ms.map(Duration::from_millis),
        grace: spec
            .grace_ms
            .map_or(inner.config.default_grace, Duration::from_millis)
            .min(MAX_GRACE),
        detach_after: detach::resolve(spec.detach_timeout_ms, inner.config.detach_timeout),
    };
    tracing::debug!(exec_id = id, pid, argv = ?spec.argv, "exec started");
    tokio::spawn(supervise(
        Arc::clone(inner),
        Arc::clone(&record),
        exit_rx,
        output,
        limits,
        permit,
    ));
    Ok(record)
}

/// Where an exec's output comes from.
enum Output {
    /// Separate stdout and stderr pipes.
    Pipes(pipe::Receiver, pipe::Receiver),
    /// A terminal's master: everything, as stdout.
    Pty(pty::Reader),
}

/// Where an exec's stdin goes, when it has one.
enum Input {
    Pipe(pipe::Sender),
    Pty(pty::Writer),
}

/// The PTY exec's command; plain execs go through [`spawn::spawn`] with
/// the same program, arguments, directory and environment.
fn command(spec: &ExecSpec, cwd: &Path, id: ExecId) -> Command {
    let (program, args) = match spec.argv.split_first() {
        Some((program, args)) => (program.as_str(), args),
        None => ("", &[][..]),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .envs(&spec.env)
        // Set last so a spec cannot hide a command from interrupt.
        .env(EXEC_MARKER_VAR, id.to_string());
    new_session(&mut cmd);
    cmd
}

/// The agent's ends of a plain exec's pipes, ready for the runtime.
fn pipes(child: spawn::Spawned) -> io::Result<(Output, Option<Input>)> {
    Ok((
        Output::Pipes(
            pipe::Receiver::from_owned_fd(child.stdout)?,
            pipe::Receiver::from_owned_fd(child.stderr)?,
        ),
        child
            .stdin
            .map(pipe::Sender::from_owned_fd)
            .transpose()?
            .map(Input::Pipe),
    ))
}

async fn supervise(
    inner: Arc<Inner>,
    record: Arc<ExecRecord>,
    mut exit_rx: oneshot::Receiver<ProcessExit>,
    mut output: Output,
    limits: Limits,
    permit: OwnedSemaphorePermit,
) {
    // The pumps borrow the streams, so closing them can wait until the exit
    // has gone out (see the end).
    let pumps = async {
        match &mut output {
            Output::Pipes(stdout, stderr) => {
                tokio::join!(
                    pump(&record, Channel::Stdout, stdout),
                    pump(&record, Channel::Stderr, stderr)
                );
            }
            Output::Pty(reader) => pump(&record, Channel::Stdout, reader).await,
        }
    };
    tokio::pin!(pumps);
    let mut pumps_done = false;

    let far = Instant::now() + FAR_FUTURE;
    let mut timeout_at = limits.timeout.map(|t| Instant::now() + t);
    let mut detach = DetachTimer::new(record.attached(), limits.detach_after);
    let unattended = detach.expired();
    tokio::pin!(unattended);
    let mut detach_fired = false;

    let status = loop {
        tokio::select! {
            status = &mut exit_rx => break status.ok(),
            () = &mut pumps, if !pumps_done => pumps_done = true,
            () = sleep_until(timeout_at.unwrap_or(far)), if timeout_at.is_some() => {
                timeout_at = None;
                tracing::debug!(exec_id = record.id, "timeout");
                record.mark_timed_out();
                inner.kill(&record, Signal::SIGINT, limits.grace);
            }
            () = &mut unattended, if !detach_fired => {
                detach_fired = true;
                tracing::debug!(exec_id = record.id, "no client attached; killing");
                inner.kill(&record, Signal::SIGINT, inner.config.default_grace);
            }
        }
    };
    let duration = record.started.elapsed();
    if status.is_none() {
        tracing::warn!(exec_id = record.id, "exit status was lost");
    }
    record.leader_exited();
    if !pumps_done {
        // Output a background child writes after this is dropped with the pipes.
        let _ = tokio::time::timeout(LINGER, &mut pumps).await;
    }
    let exit = record.finish(status, duration);
    tracing::debug!(exec_id = record.id, ?exit, "exec finished");
    inner.retire(record.id, record.output_memory());
    // Let the connection send the exit first: unregistering and closing the
    // streams is a few system calls the client need not wait for.
    tokio::task::yield_now().await;
    drop(permit);
}

thread_local! {
    /// Where every pump on this thread reads before copying out what it got.
    /// One buffer per thread instead of two of [`MAX_FRAME_PAYLOAD`] per exec:
    /// with musl's allocator each of those was an `mmap`, page faults and a
    /// `munmap` on every exec, however little the command printed.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; MAX_FRAME_PAYLOAD].into_boxed_slice());
}

/// Moves one output stream into the exec's record until end of file.
pub(super) async fn pump(record: &ExecRecord, channel: Channel, mut pipe: impl AsyncRead + Unpin) {
    loop {
        match read_chunk(&mut pipe).await {
            Ok(chunk) if chunk.is_empty() => break,
            Ok(chunk) => record.append(channel, chunk),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => {
                tracing::warn!(exec_id = record.id, ?channel, %err, "output pipe failed");
                break;
            }
        }
    }
}

/// The next chunk `from` has, at most [`MAX_FRAME_PAYLOAD`] bytes; empty at
/// end of file. The scratch buffer is borrowed only within one poll, so
/// pumps waiting on other pipes never hold it.
async fn read_chunk(from: &mut (impl AsyncRead + Unpin)) -> io::Result<Bytes> {
    std::future::poll_fn(|cx| {
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buf) => poll_chunk(from, cx, &mut buf),
            // Only reachable if a read re-entered a pump on this thread.
            Err(_) => poll_chunk(from, cx, &mut vec![0; MAX_FRAME_PAYLOAD]),
        })
    })
    .await
}

fn poll_chunk(
    from: &mut (impl AsyncRead + Unpin),
    cx: &mut Context<'_>,
    buf: &mut [u8],
) -> Poll<io::Result<Bytes>> {
    let mut read = ReadBuf::new(buf);
    ready!(Pin::new(from).poll_read(cx, &mut read))?;
    Poll::Ready(Ok(Bytes::copy_from_slice(read.filled())))
}

/// Writes queued stdin; EOF when the queue closes. Gives up when the exec has
/// finished, since a process that never reads would otherwise hold this task.
pub(super) async fn feed_stdin(
    mut pipe: impl AsyncWrite + Unpin,
    mut rx: mpsc::Receiver<Bytes>,
    mut finished: watch::Receiver<bool>,
) {
    loop {
        let data = tokio::select! {
            data = rx.recv() => match data {
                Some(data) => data,
                None => break,
            },
            _ = finished.wait_for(|done| *done) => break,
        };
        tokio::select! {
            written = pipe.write_all(&data) => if written.is_err() {
                // The reader is gone (EPIPE); later writes are refused as closed.
                break;
            },
            _ = finished.wait_for(|done| *done) => break,
        }
    }
}
