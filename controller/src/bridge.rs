//! Bridges between async byte streams (the engine's and the agent's HTTP
//! bodies) and blocking `std::io` code (the store, tar reading and writing),
//! which runs on the blocking pool. A bounded channel between them carries
//! the chunks, so neither side buffers a whole body and a slow side slows
//! the other down instead of filling memory.

use std::io::{self, Read, Write};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

/// Chunks in flight between the two sides.
const CHANNEL_CHUNKS: usize = 16;
/// Size of the chunks a [`ChannelWriter`] sends.
const CHUNK_BYTES: usize = 256 * 1024;

/// The reading end of an async stream, for blocking code.
pub struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(error),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// Feeds `stream` to a [`ChannelReader`]; the returned future pumps until
/// the stream ends, fails (the reader then sees the error), or the reader
/// is dropped. Run the two halves concurrently.
fn reader_for<S, E>(stream: S) -> (ChannelReader, impl Future<Output = ()>)
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let pump = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| io::Error::other(e.to_string()));
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    };
    (
        ChannelReader {
            rx,
            current: Bytes::new(),
        },
        pump,
    )
}

/// Runs `consume` on the blocking pool over the bytes of `stream`, pumping
/// them to it from this task, and returns what it returns (an error only if
/// it panicked).
pub async fn consume_blocking<S, E, T>(
    stream: S,
    consume: impl FnOnce(ChannelReader) -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
    T: Send + 'static,
{
    let (reader, pump) = reader_for(stream);
    let task = tokio::task::spawn_blocking(move || consume(reader));
    pump.await;
    task.await
}

/// The writing end of an async stream, for blocking code.
pub struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    pending: Vec<u8>,
}

impl ChannelWriter {
    /// Sends what is buffered and closes the stream. Dropping the writer
    /// without finishing also ends the stream, after what was flushed.
    pub fn finish(mut self) -> io::Result<()> {
        self.flush()
    }

    /// Ends the stream with an error, so its consumer does not mistake a
    /// cut-short body for a whole one.
    pub fn fail(self, error: io::Error) {
        let _ = self.tx.blocking_send(Err(error));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.pending.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.pending));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the stream's reader is gone"))
    }
}

/// A [`ChannelWriter`] for blocking code and the stream its bytes come out
/// of, for an async consumer.
pub fn writer_stream() -> (
    ChannelWriter,
    impl Stream<Item = io::Result<Bytes>> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    (
        ChannelWriter {
            tx,
            pending: Vec::with_capacity(CHUNK_BYTES),
        },
        stream,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (mut reader, pump) = reader_for(stream);
        let consumer = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out).map(|_| out)
        });
        pump.await;
        producer.await.unwrap();
        assert_eq!(consumer.await.unwrap().unwrap(), data);

        let failing = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err("the peer went away"),
        ]);
        let (mut reader, pump) = reader_for(failing);
        let consumer = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out)
        });
        pump.await;
        let error = consumer.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("went away"), "{error}");
    }
}
