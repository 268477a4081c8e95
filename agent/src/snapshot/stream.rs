//! Carries the layer from the blocking writer to the response, a bounded
//! number of chunks at a time.
//!
//! The tar writer is synchronous, so it runs on a blocking thread and writes
//! into a [`ChannelWriter`]; the response body is the [`LayerStream`] at the
//! other end of a channel of [`LAYER_CHANNEL_CHUNKS`] slots, so a slow client
//! pushes back on the walk instead of filling memory. A client that takes
//! nothing for [`SEND_STALL_TIMEOUT`] (or is gone) fails the writer, so the
//! sandbox is never left stopped on its account. A writer that ends without
//! [`ChannelWriter::complete`] (an error, a panic) makes the stream end in an
//! error after the chunks already sent, so hyper cuts the response off
//! rather than ending it cleanly.

use std::io::{self, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// Bytes per chunk sent to the response.
pub const LAYER_CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight between the writer and the connection.
pub const LAYER_CHANNEL_CHUNKS: usize = 16;
/// Longest wait for the client to make room for the next chunk.
pub const SEND_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Both ends of a new layer channel.
pub fn channel(handle: Handle) -> (ChannelWriter, LayerStream) {
    let (tx, rx) = mpsc::channel(LAYER_CHANNEL_CHUNKS);
    let cut = Arc::new(AtomicBool::new(false));
    let writer = ChannelWriter {
        tx: Some(tx),
        buf: Vec::with_capacity(LAYER_CHUNK_BYTES),
        handle,
        cut: Arc::clone(&cut),
        completed: false,
    };
    let stream = LayerStream {
        rx,
        cut,
        done: false,
        _hold: None,
    };
    (writer, stream)
}

/// The blocking half: buffers writes into chunks and sends them.
pub struct ChannelWriter {
    tx: Option<mpsc::Sender<Bytes>>,
    buf: Vec<u8>,
    handle: Handle,
    /// Set when the layer ends without being completed.
    cut: Arc<AtomicBool>,
    completed: bool,
}

impl ChannelWriter {
    /// Sends what is buffered and ends the stream cleanly.
    pub fn complete(mut self) -> io::Result<()> {
        self.send_buffered()?;
        self.completed = true;
        Ok(())
    }

    /// Ends the stream in an error after what was already sent.
    pub fn abort(self) {
        // Dropping without `completed` does it.
    }

    fn send_buffered(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(LAYER_CHUNK_BYTES),
        ));
        let Some(tx) = &self.tx else {
            return Err(gone());
        };
        let sent = self
            .handle
            .block_on(tokio::time::timeout(SEND_STALL_TIMEOUT, tx.send(chunk)));
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                self.tx = None;
                Err(gone())
            }
            Err(_) => {
                self.tx = None;
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took nothing for {SEND_STALL_TIMEOUT:?}"),
                ))
            }
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the client went away")
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.tx.is_none() {
            return Err(gone());
        }
        let n = data.len().min(LAYER_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= LAYER_CHUNK_BYTES {
            self.send_buffered()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffered()
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        if !self.completed {
            // Before the sender goes (a field, dropped after this runs), so
            // the stream sees the flag when it sees the end.
            self.cut.store(true, Ordering::Release);
        }
    }
}

/// The response body: the chunks the writer sends, then the end, or an error
/// if the writer did not complete.
pub struct LayerStream {
    rx: mpsc::Receiver<Bytes>,
    cut: Arc<AtomicBool>,
    done: bool,
    /// Whatever must live as long as the response (e.g. an activity guard).
    _hold: Option<Box<dyn Send>>,
}

impl LayerStream {
    /// Keeps `value` alive until the body is dropped.
    pub fn hold(mut self, value: impl Send + 'static) -> Self {
        self._hold = Some(Box::new(value));
        self
    }
}

impl Body for LayerStream {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            Poll::Ready(None) => {
                this.done = true;
                if this.cut.load(Ordering::Acquire) {
                    Poll::Ready(Some(Err(io::Error::other(
                        "the stream failed before its end",
                    ))))
                } else {
                    Poll::Ready(None)
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_completed_stream_ends_cleanly_and_an_abandoned_one_in_an_error() {
        let (mut writer, stream) = channel(Handle::current());
        let job = tokio::task::spawn_blocking(move || {
            writer
                .write_all(&vec![7u8; LAYER_CHUNK_BYTES + 10])
                .unwrap();
            writer.complete().unwrap();
        });
        let body = stream.collect().await.unwrap().to_bytes();
        job.await.unwrap();
        assert_eq!(body.len(), LAYER_CHUNK_BYTES + 10);

        let (mut writer, mut stream) = channel(Handle::current());
        let job = tokio::task::spawn_blocking(move || {
            writer.write_all(&vec![7u8; LAYER_CHUNK_BYTES]).unwrap();
            writer.abort();
        });
        let first = stream.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap().len(), LAYER_CHUNK_BYTES);
        assert!(stream.frame().await.unwrap().is_err());
        assert!(stream.frame().await.is_none());
        job.await.unwrap();

        // A client that went away fails the writer instead of blocking it.
        let (mut writer, stream) = channel(Handle::current());
        drop(stream);
        let failed = tokio::task::spawn_blocking(move || {
            writer.write_all(&vec![7u8; LAYER_CHUNK_BYTES]).unwrap_err()
        });
        assert_eq!(failed.await.unwrap().kind(), io::ErrorKind::BrokenPipe);
    }
}
