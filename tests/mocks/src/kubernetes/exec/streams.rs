//! An exec's streams over SPDY/3.1, kubectl's fallback: the client opens
//! one stream per `streamtype` header (`error`, then `stdin`, `stdout`,
//! `stderr` as asked, and `resize` with a terminal), each answered at
//! once; when all it asked for are there (within
//! [`STREAM_CREATION_TIMEOUT`], as the kubelet waits) the command starts.
//! Output goes out as DATA on its stream; the client's FIN (or reset) on
//! stdin ends the process's stdin. At the end the server closes stdout
//! and stderr, writes the status on the error stream and closes it, closes
//! its halves of the rest, sends GOAWAY and waits for the client to hang
//! up.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Exec;
use super::channels::FINISH_GRACE;
use super::process::{self, INPUT_QUEUE, Inbox, Input, OUTPUT_QUEUE, SizeDecoder};
use crate::containers::Container;
use crate::containers::exec::Output;
use crate::kubernetes::spdy::session::{Event, Session, Writer};

/// Longest wait for the client to open the streams it asked for (the
/// kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The client's streams, by type.
#[derive(Default)]
struct Streams {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Streams {
    fn opened(&self) -> usize {
        [
            self.error,
            self.stdin,
            self.stdout,
            self.stderr,
            self.resize,
        ]
        .iter()
        .flatten()
        .count()
    }

    /// Records a new stream; false for one the exec has no use for.
    fn open(&mut self, stream: u32, kind: Option<&str>) -> bool {
        let slot = match kind {
            Some("error") => &mut self.error,
            Some("stdin") => &mut self.stdin,
            Some("stdout") => &mut self.stdout,
            Some("stderr") => &mut self.stderr,
            Some("resize") => &mut self.resize,
            _ => return false,
        };
        if slot.is_some() {
            return false;
        }
        *slot = Some(stream);
        true
    }

    /// Takes what the client did; input goes to `inbox`.
    async fn take(
        &mut self,
        event: Event,
        inbox: &mut Inbox,
        sizes: &mut SizeDecoder,
        writer: &Writer,
    ) {
        match event {
            Event::Opened { stream, headers } => {
                if !self.open(stream, Event::header(&headers, "streamtype")) {
                    writer.reset(stream).await;
                }
            }
            Event::Data { stream, bytes, fin } if Some(stream) == self.stdin => {
                if !bytes.is_empty() {
                    inbox.push(Input::Stdin(bytes));
                }
                if fin {
                    inbox.push(Input::StdinEnd);
                }
            }
            Event::Data { stream, bytes, .. } if Some(stream) == self.resize => {
                for size in sizes.push(&bytes) {
                    inbox.push(Input::Resize(size));
                }
            }
            Event::Reset(stream) if Some(stream) == self.stdin => inbox.push(Input::StdinEnd),
            // The client's halves of the output streams carry nothing.
            Event::Data { .. } | Event::Reset(_) => {}
        }
    }
}

/// Serves one exec over a SPDY connection until the command ends or the
/// client goes.
pub async fn serve<IO>(io: IO, exec: Exec, container: Container, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut session = Session::start(io, &cancel);
    let writer = session.writer();
    let expected = 1
        + usize::from(exec.command.stdin)
        + usize::from(exec.stdout)
        + usize::from(exec.stderr)
        + usize::from(exec.command.tty);
    let (to_process, input) = mpsc::channel(INPUT_QUEUE);
    let mut inbox = Inbox::new(to_process);
    let mut sizes = SizeDecoder::default();
    let mut streams = Streams::default();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while streams.opened() < expected {
        let event = tokio::select! {
            event = session.next() => event,
            () = tokio::time::sleep_until(deadline) => None,
        };
        let Some(event) = event else {
            tracing::debug!("an exec's streams were not all opened");
            session.close().await;
            return;
        };
        streams.take(event, &mut inbox, &mut sizes, &writer).await;
    }
    let (output, mut from_process) = mpsc::channel(OUTPUT_QUEUE);
    let running = tokio::spawn(process::run(container, exec.command.clone(), input, output));
    let mut stayed = true;
    loop {
        tokio::select! {
            () = inbox.deliver(), if !inbox.is_empty() => {}
            chunk = from_process.recv() => {
                let (stream, bytes) = match chunk {
                    Some(Output::Stdout(bytes)) => (streams.stdout, bytes),
                    Some(Output::Stderr(bytes)) => (streams.stderr, bytes),
                    None => break,
                };
                // Output of a stream the client did not open is dropped.
                if let Some(stream) = stream {
                    if !writer.data(stream, bytes, false).await {
                        stayed = false;
                        break;
                    }
                }
            }
            event = session.next(), if inbox.is_empty() => match event {
                Some(event) => streams.take(event, &mut inbox, &mut sizes, &writer).await,
                None => {
                    stayed = false;
                    break;
                }
            },
        }
    }
    if !stayed {
        // Nobody to tell: the process is let go.
        running.abort();
        session.close().await;
        return;
    }
    drop(inbox);
    let outcome = running.await.ok();
    for stream in [streams.stdout, streams.stderr].into_iter().flatten() {
        writer.finish(stream).await;
    }
    if let Some(error) = streams.error {
        if let Some(status) = outcome.as_ref().and_then(|o| exec.status(o)) {
            writer.data(error, status.into(), false).await;
        }
        writer.finish(error).await;
    }
    for stream in [streams.stdin, streams.resize].into_iter().flatten() {
        writer.finish(stream).await;
    }
    writer.go_away().await;
    drop(writer);
    let _ = tokio::time::timeout(FINISH_GRACE, async {
        while session.next().await.is_some() {}
    })
    .await;
    session.close().await;
}
