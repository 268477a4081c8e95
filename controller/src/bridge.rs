//! Bridges between async byte streams (the engine's and the agent's HTTP
//! bodies) and blocking `std::io` code (the store, tar reading and writing),
//! which runs on the blocking pool, made of tokio-util's adapters.
//!
//! Reading ([`consume_blocking`]): blocking code gets a `Read` over the
//! stream (`StreamReader` under `SyncIoBridge`). Each read waits for the
//! stream's next chunk, so at most one chunk is held and a slow reader slows
//! the stream down instead of filling memory; a stream error is the read's.
//!
//! Writing ([`writer_stream`]): blocking code gets a `Write` whose bytes come
//! out of a stream in chunks of about [`CHUNK_BYTES`] (a `BufWriter` over
//! `SinkWriter`, `CopyToBytes` and `PollSender`, under `SyncIoBridge`),
//! through a channel of [`CHANNEL_CHUNKS`], so a slow consumer slows the
//! writer down. [`ChannelWriter::fail`] ends the stream with an error, so the
//! consumer never takes a cut-short body for a whole one, and a consumer that
//! went away fails the writer's next send.

use std::io::{self, BufWriter, Write};

use bytes::Bytes;
use futures_util::sink::SinkMapErr;
use futures_util::stream::BoxStream;
use futures_util::{SinkExt, Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::io::{CopyToBytes, SinkWriter, StreamReader, SyncIoBridge};
use tokio_util::sync::{PollSendError, PollSender};

/// Chunks in flight between a [`ChannelWriter`] and its stream.
const CHANNEL_CHUNKS: usize = 16;
/// Size of the chunks a [`ChannelWriter`] sends.
const CHUNK_BYTES: usize = 256 * 1024;

/// The reading end of an async stream, for blocking code.
pub type ChannelReader = SyncIoBridge<StreamReader<BoxStream<'static, io::Result<Bytes>>, Bytes>>;

/// Runs `consume` on the blocking pool over the bytes of `stream`, and
/// returns what it returns (an error only if it panicked). The stream is
/// read as `consume` reads, and dropped when it returns.
pub async fn consume_blocking<S, E, T>(
    stream: S,
    consume: impl FnOnce(ChannelReader) -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
    T: Send + 'static,
{
    let reader = reader_for(stream);
    tokio::task::spawn_blocking(move || consume(reader)).await
}

/// A [`ChannelReader`] over `stream`; create it on the runtime, read it off it.
fn reader_for<S, E>(stream: S) -> ChannelReader
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    let chunks = stream.map(|chunk| chunk.map_err(|e| io::Error::other(e.to_string())));
    SyncIoBridge::new(StreamReader::new(chunks.boxed()))
}

/// Where a [`ChannelWriter`]'s chunks go: the channel, as a sink of bytes.
type ChunkSink = SinkMapErr<PollSender<Bytes>, fn(PollSendError<Bytes>) -> io::Error>;

/// The writing end of an async stream, for blocking code.
pub struct ChannelWriter {
    bytes: BufWriter<SyncIoBridge<SinkWriter<CopyToBytes<ChunkSink>>>>,
    /// The error that ends the stream after its last chunk, if it fails.
    failure: oneshot::Sender<io::Error>,
}

impl ChannelWriter {
    /// Sends what is buffered and closes the stream. Dropping the writer
    /// without finishing also ends the stream.
    pub fn finish(mut self) -> io::Result<()> {
        self.bytes.flush()
    }

    /// Ends the stream with an error (what is buffered is dropped), so its
    /// consumer does not mistake a cut-short body for a whole one.
    pub fn fail(self, error: io::Error) {
        let Self { bytes, failure } = self;
        drop(bytes.into_parts());
        let _ = failure.send(error);
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.bytes.flush()
    }
}

/// A [`ChannelWriter`] for blocking code and the stream its bytes come out
/// of, for an async consumer. Call it on the runtime; write off it.
pub fn writer_stream() -> (
    ChannelWriter,
    impl Stream<Item = io::Result<Bytes>> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let (failure, failed) = oneshot::channel();
    let gone: fn(PollSendError<Bytes>) -> io::Error =
        |_| io::Error::new(io::ErrorKind::BrokenPipe, "the stream's reader is gone");
    let sink = PollSender::new(tx).sink_map_err(gone);
    // The chunks, then the writer's failure if it failed: the channel closes
    // when the writer is dropped, after `fail` has sent its error.
    let stream = futures_util::stream::unfold((rx, Some(failed)), |(mut rx, failed)| async move {
        match rx.recv().await {
            Some(chunk) => Some((Ok(chunk), (rx, failed))),
            None => Some((Err(failed?.await.ok()?), (rx, None))),
        }
    });
    let writer = ChannelWriter {
        bytes: BufWriter::with_capacity(
            CHUNK_BYTES,
            SyncIoBridge::new(SinkWriter::new(CopyToBytes::new(sink))),
        ),
        failure,
    };
    (writer, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_cross_both_ways_and_errors_arrive() {
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let (mut writer, stream) = writer_stream();
        let expected = data.clone();
        let producer = tokio::task::spawn_blocking(move || {
            for chunk in expected.chunks(7000) {
                writer.write_all(chunk).unwrap();
            }
            writer.finish().unwrap();
        });
        let mut reader = reader_for(stream);
        let consumer = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out).map(|_| out)
        });
        producer.await.unwrap();
        assert_eq!(consumer.await.unwrap().unwrap(), data);

        let failing = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err("the peer went away"),
        ]);
        let mut reader = reader_for(failing);
        let consumer = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out)
        });
        let error = consumer.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("went away"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_writer_is_an_error_and_a_gone_reader_fails_the_writer() {
        let (mut writer, stream) = writer_stream();
        let mut reader = reader_for(stream);
        let producer = tokio::task::spawn_blocking(move || {
            writer.write_all(&vec![7; CHUNK_BYTES + 1]).unwrap();
            writer.fail(io::Error::other("the store broke"));
        });
        let consumer = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0; 4096];
            let mut read = 0;
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => panic!("a clean end after {read} bytes"),
                    Ok(n) => read += n,
                    Err(error) => return (read, error),
                }
            }
        });
        producer.await.unwrap();
        let (read, error) = consumer.await.unwrap();
        assert_eq!(
            read,
            CHUNK_BYTES + 1,
            "what was sent before the failure arrives"
        );
        assert!(error.to_string().contains("store broke"), "{error}");

        let (mut writer, stream) = writer_stream();
        drop(stream);
        let written = tokio::task::spawn_blocking(move || {
            writer.write_all(&vec![7; CHUNK_BYTES + 1])?;
            writer.finish()
        });
        let error = written.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
    }
}
