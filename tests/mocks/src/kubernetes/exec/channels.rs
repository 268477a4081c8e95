//! An exec's streams over WebSocket channels: every binary message starts
//! with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize).
//! The server first sends an empty message on the lowest channel it
//! writes (stdout, else stderr, else error) to say the streams are open,
//! relays output as it comes, and at the end writes the error channel's
//! status and closes the WebSocket with a normal closure (1000), which
//! client-go reads as the end of every stream. In `v5` a message
//! `[255, channel]` closes one of the client's streams: for stdin, the
//! process's stdin ends; in earlier versions stdin ends only with the
//! connection.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::process::{self, INPUT_QUEUE, Inbox, Input, OUTPUT_QUEUE, SizeDecoder};
use super::{Dialect, Exec};
use crate::containers::Container;
use crate::containers::exec::Output;

/// The process's stdin.
const STDIN: u8 = 0;
/// Its stdout.
const STDOUT: u8 = 1;
/// Its stderr.
const STDERR: u8 = 2;
/// The status at the end.
const ERROR: u8 = 3;
/// Terminal sizes.
const RESIZE: u8 = 4;
/// `v5`: closes the client's stream named by the next byte.
const CLOSE: u8 = 255;
/// Longest wait, after the status, for the client to close the WebSocket
/// (it has read everything by then).
pub const FINISH_GRACE: Duration = Duration::from_secs(10);

/// A channel message: its byte, then `data`.
fn on(channel: u8, data: &[u8]) -> Message {
    let mut message = Vec::with_capacity(data.len() + 1);
    message.push(channel);
    message.extend_from_slice(data);
    Message::binary(message)
}

/// Serves one exec over `socket` until the command ends or the client goes.
pub async fn serve<S>(
    socket: WebSocketStream<S>,
    exec: Exec,
    container: Container,
    cancel: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let first = if exec.stdout {
        STDOUT
    } else if exec.stderr {
        STDERR
    } else {
        ERROR
    };
    if sink.send(on(first, &[])).await.is_err() {
        return;
    }
    let (to_process, input) = mpsc::channel(INPUT_QUEUE);
    let (output, mut from_process) = mpsc::channel(OUTPUT_QUEUE);
    let running = tokio::spawn(process::run(container, exec.command.clone(), input, output));
    let mut inbox = Inbox::new(to_process);
    let mut sizes = SizeDecoder::default();
    let closes = exec.dialect == Dialect::Translator;
    let mut stayed = true;
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                stayed = false;
                break;
            }
            () = inbox.deliver(), if !inbox.is_empty() => {}
            chunk = from_process.recv() => {
                let message = match chunk {
                    Some(Output::Stdout(bytes)) if exec.stdout => on(STDOUT, &bytes),
                    Some(Output::Stderr(bytes)) if exec.stderr => on(STDERR, &bytes),
                    // A stream the client did not attach.
                    Some(_) => continue,
                    None => break,
                };
                if sink.send(message).await.is_err() {
                    stayed = false;
                    break;
                }
            }
            incoming = stream.next(), if inbox.is_empty() => {
                // The server reads text messages as bytes too (the Python
                // client writes a string's stdin as text).
                let bytes = match incoming {
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Text(text))) => Bytes::copy_from_slice(text.as_bytes()),
                    Some(Ok(Message::Close(_)) | Err(_)) | None => {
                        stayed = false;
                        break;
                    }
                    // Pings are answered by the WebSocket layer.
                    Some(Ok(_)) => continue,
                };
                match bytes.split_first() {
                    Some((&CLOSE, [STDIN])) if closes => inbox.push(Input::StdinEnd),
                    Some((&STDIN, data)) if exec.command.stdin && !data.is_empty() => {
                        inbox.push(Input::Stdin(bytes.slice(1..)));
                    }
                    Some((&RESIZE, data)) => {
                        for size in sizes.push(data) {
                            inbox.push(Input::Resize(size));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    if !stayed {
        // Nobody to tell: the process is let go (its stdin and output
        // streams close), as a runtime does when the client hangs up.
        running.abort();
        return;
    }
    drop(inbox);
    let outcome = running.await.ok();
    if let Some(status) = outcome.as_ref().and_then(|o| exec.status(o)) {
        if sink.send(on(ERROR, &status)).await.is_err() {
            return;
        }
    }
    let close = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    if sink.send(Message::Close(Some(close))).await.is_err() {
        return;
    }
    // Read on until the client answers the close, so what was sent is not
    // cut off by a reset.
    let _ = tokio::time::timeout(FINISH_GRACE, async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
}
