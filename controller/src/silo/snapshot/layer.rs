//! Receiving a snapshot layer from an agent into the store. The stream is
//! untrusted (it comes from inside the sandbox): it is parsed as it is
//! written, so a climbing name or a body cut short is refused and leaves no
//! blob behind, and a full disk is told apart from a bad stream.

use std::fmt::Display;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

use super::{SnapshotError, SnapshotProgress, SnapshotProgressFn};
use crate::bridge;
use crate::store::{BlobTee, LayerDelta, LayerStats, Store, StoreError, Written};

/// A tar archive ends with two zero blocks.
const TAR_END_MARKER: usize = 1024;

/// Streams an agent's layer into the store off the async threads (see
/// [`receive_layer`]): a broken or refused stream fails as the layer of
/// sandbox `name`, a failing store (a full disk) as the store.
pub(super) async fn store_layer<S, E>(
    stream: S,
    store: &Store,
    progress: &SnapshotProgressFn,
    name: &str,
) -> Result<(Written, LayerStats), SnapshotError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Display,
{
    let (store, progress) = (store.clone(), Arc::clone(progress));
    bridge::consume_blocking(stream, move |reader| {
        receive_layer(reader, &store, &progress)
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))?
    .map_err(|failure| match failure {
        Received::Stream(source) => SnapshotError::Layer {
            name: name.to_owned(),
            source,
        },
        Received::Store(error) => SnapshotError::Store(error),
    })
}

/// Writes the agent's layer into the store, checking as it goes that it is
/// one whole tar (its end marker included: a body cut short at an entry
/// boundary reads like a shorter tar); returns the blob and what it holds.
fn receive_layer(
    reader: bridge::ChannelReader,
    store: &Store,
    progress: &SnapshotProgressFn,
) -> Result<(Written, LayerStats), Received> {
    let mut blob = store.writer().map_err(Received::Store)?;
    let tail = Tail {
        inner: CountingReader {
            inner: reader,
            progress: Arc::clone(progress),
        },
        bytes: Vec::with_capacity(2 * TAR_END_MARKER),
    };
    let mut tee = BlobTee::new(tail, &mut blob);
    let parsed = LayerDelta::read(&mut tee)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        .and_then(|delta| io::copy(&mut tee, &mut io::sink()).map(|_| delta.stats()));
    // A full disk fails the parser's read too: the store's error is the one to tell.
    if let Some(error) = tee.write_error() {
        return Err(Received::Store(error));
    }
    let stats = parsed.map_err(Received::Stream)?;
    let tail = &tee.inner().bytes;
    if tail.len() < TAR_END_MARKER || tail.iter().any(|b| *b != 0) {
        return Err(Received::Stream(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the layer ended without the tar end marker (the agent stopped short)",
        )));
    }
    let written = blob.finish().map_err(Received::Store)?;
    Ok((written, stats))
}

/// Why a layer was not received: the stream from the agent, or the store.
#[derive(Debug)]
enum Received {
    Stream(io::Error),
    Store(StoreError),
}

/// Reports bytes read as progress.
pub(super) struct CountingReader<R> {
    pub(super) inner: R,
    pub(super) progress: SnapshotProgressFn,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.progress)(SnapshotProgress::Bytes(n as u64));
        Ok(n)
    }
}

/// Reports bytes written as progress.
pub(super) struct CountingWriter<W> {
    pub(super) inner: W,
    pub(super) progress: SnapshotProgressFn,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        (self.progress)(SnapshotProgress::Bytes(n as u64));
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Remembers the last [`TAR_END_MARKER`] bytes read through it.
struct Tail<R> {
    inner: R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Tail<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        if self.bytes.len() > TAR_END_MARKER {
            self.bytes.drain(..self.bytes.len() - TAR_END_MARKER);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::no_progress;
    use super::*;
    use bytes::Bytes;

    /// A ustar entry written by hand, so a hostile name stays hostile.
    fn entry(name: &str, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    async fn receive(store: &Store, bytes: Vec<u8>) -> Result<Written, Received> {
        let chunks = vec![Ok::<_, io::Error>(Bytes::from(bytes))];
        let store = store.clone();
        bridge::consume_blocking(futures_util::stream::iter(chunks), move |reader| {
            receive_layer(reader, &store, &no_progress())
        })
        .await
        .unwrap()
        .map(|(written, _)| written)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hostile_or_cut_short_layer_is_refused_and_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let temps = || {
            std::fs::read_dir(dir.path().join("store/tmp"))
                .unwrap()
                .count()
        };

        let mut good = entry("etc/motd", b"hello\n");
        good.extend_from_slice(&[0; TAR_END_MARKER]);
        let written = receive(&store, good.clone()).await.unwrap();
        assert_eq!(written.size, good.len() as u64);

        let mut climbing = entry("../escape", b"x");
        climbing.extend_from_slice(&[0; TAR_END_MARKER]);
        let refused = receive(&store, climbing).await.unwrap_err();
        assert!(
            matches!(&refused, Received::Stream(e) if e.kind() == io::ErrorKind::InvalidData),
            "{refused:?}"
        );

        let cut = entry("etc/motd", b"hello\n");
        let refused = receive(&store, cut).await.unwrap_err();
        assert!(
            matches!(&refused, Received::Stream(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{refused:?}"
        );

        assert_eq!(
            store.list().unwrap().len(),
            1,
            "only the whole layer is stored"
        );
        assert_eq!(temps(), 0, "a refused layer leaves no temp file");
    }
}
