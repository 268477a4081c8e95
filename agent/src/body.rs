//! Request bodies: carried from the async connection to a blocking reader
//! a bounded number of chunks at a time, and the one error every channel
//! that reads a body answers for it ([`BodyError`]).
//!
//! The tar and gzip readers are synchronous, so extraction runs on a
//! blocking thread and reads the body through [`ChannelReader`]; the
//! connection task [`pump`]s frames into a channel of [`BODY_CHANNEL_CHUNKS`]
//! slots, so a slow disk pushes back on the client instead of filling memory.
//! When the extractor stops early (a rejected entry), the pump keeps reading
//! and discarding, up to the bundle cap, so the client gets the answer on a
//! clean connection instead of a reset mid-upload.

use std::io::{self, Read};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use silo_protocol::ErrorKind;
use tokio::sync::mpsc;

/// Body chunks in flight between the connection and the extractor.
pub const BODY_CHANNEL_CHUNKS: usize = 16;
/// Longest wait for the next piece of a request body before giving up.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request's body was not taken, whatever the channel: push, layer
/// apply, file upload, snapshot, rewind or index request.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Over the channel's cap, as declared or as sent.
    #[error("request body{} is over the limit of {limit} bytes", declared_size(*.declared))]
    TooLarge {
        /// The length the client declared, when that is what was over.
        declared: Option<u64>,
        /// The cap.
        limit: u64,
    },
    /// The connection failed or the client went away mid-body.
    #[error("request body was cut off")]
    Broken(#[source] io::Error),
    /// Nothing arrived for [`BODY_IDLE_TIMEOUT`].
    #[error("request body stalled for {0:?}")]
    Stalled(Duration),
}

impl BodyError {
    /// The answer's kind: a body over its cap is too large, and one that
    /// did not arrive whole is malformed.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TooLarge { .. } => ErrorKind::TooLarge,
            Self::Broken(_) | Self::Stalled(_) => ErrorKind::Malformed,
        }
    }

    /// A body over `limit`, by its declared length or by what arrived.
    pub fn over(limit: u64) -> Self {
        Self::TooLarge {
            declared: None,
            limit,
        }
    }
}

fn declared_size(declared: Option<u64>) -> String {
    declared.map_or_else(String::new, |bytes| format!(" of {bytes} bytes"))
}

/// The blocking half: reads what the pump sends.
pub struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    chunk: Bytes,
}

impl ChannelReader {
    /// A reader over chunks from `rx`; ends when the pump is done.
    pub fn new(rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        Self {
            rx,
            chunk: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(err)) => return Err(err),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}

/// How the body ended.
#[derive(Debug)]
#[must_use = "a body that did not end whole is the answer"]
pub enum Pumped {
    /// Read to the end.
    Complete,
    /// More than `cap` bytes arrived; reading stopped.
    OverCap,
    /// The connection failed or the client went away.
    Broken(hyper::Error),
    /// Nothing arrived for the idle timeout.
    Stalled,
}

impl Pumped {
    /// What went wrong with a body that was pumped against `cap`; `None`
    /// when it arrived whole.
    pub fn error(self, cap: u64) -> Option<BodyError> {
        match self {
            Self::Complete => None,
            Self::OverCap => Some(BodyError::over(cap)),
            Self::Broken(err) => Some(BodyError::Broken(io::Error::other(err))),
            Self::Stalled => Some(BodyError::Stalled(BODY_IDLE_TIMEOUT)),
        }
    }
}

/// The next frame, or `Err` when none arrives within `idle`.
async fn next_frame(
    body: &mut Incoming,
    idle: Duration,
) -> Result<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>, ()> {
    tokio::time::timeout(idle, body.frame())
        .await
        .map_err(|_| ())
}

/// Forwards `body` into `tx` until it ends, failing past `cap` bytes.
pub async fn pump(mut body: Incoming, tx: mpsc::Sender<io::Result<Bytes>>, cap: u64) -> Pumped {
    let idle = BODY_IDLE_TIMEOUT;
    let mut total = 0u64;
    let mut tx = Some(tx);
    loop {
        let frame = match next_frame(&mut body, idle).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(()) => {
                if let Some(tx) = &tx {
                    let _ = tx.send(Err(io::Error::other("request body stalled"))).await;
                }
                return Pumped::Stalled;
            }
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(err) => {
                if let Some(tx) = &tx {
                    let _ = tx
                        .send(Err(io::Error::other("request body ended early")))
                        .await;
                }
                return Pumped::Broken(err);
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total > cap {
            if let Some(tx) = &tx {
                let _ = tx
                    .send(Err(io::Error::other("bundle over the size cap")))
                    .await;
            }
            return Pumped::OverCap;
        }
        if let Some(sender) = &tx {
            if sender.send(Ok(data)).await.is_err() {
                // The extractor has stopped; drain the rest for a clean answer.
                tx = None;
            }
        }
    }
    Pumped::Complete
}

/// Reads and drops the body (up to `cap`), for answers that need none of it.
pub async fn drain(mut body: Incoming, cap: u64) -> Pumped {
    let idle = BODY_IDLE_TIMEOUT;
    let mut total = 0u64;
    loop {
        let frame = match next_frame(&mut body, idle).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(()) => return Pumped::Stalled,
        };
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    total += data.len() as u64;
                    if total > cap {
                        return Pumped::OverCap;
                    }
                }
            }
            Err(err) => return Pumped::Broken(err),
        }
    }
    Pumped::Complete
}
