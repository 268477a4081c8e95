//! Blobs put in a fleet's shared store before a row names them, so a
//! recorded snapshot (or stored image) is durable there and any host can
//! restore it. Without a shared store this is nothing: the home's store is
//! the only one.
//!
//! Each blob is first held against the shared store's gc (see the state's
//! `blobs`), then looked for in the bucket and sent if it is not there. The
//! hold lasts until the row is recorded ([`BlobHold`] is dropped after). A
//! bucket that does not answer is waited for, up to
//! `SILO_STORE_WAIT_SECS` (default [`DEFAULT_WAIT`]); then the call fails
//! and nothing is recorded, so the same call made again later completes.

use std::time::{Duration, Instant};

use super::SnapshotError;
use crate::retry::{Backoff, jitter};
use crate::silo::Silo;
use crate::state::StoredImage;
use crate::store::{Digest, SharedError, SharedStore, Store};

/// How long a bucket that does not answer is waited for by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// Sets that wait, in seconds.
pub const WAIT_ENV: &str = "SILO_STORE_WAIT_SECS";
/// Pauses between tries while the bucket does not answer, or while gc
/// deletes a blob that is wanted again.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(50),
    max: Duration::from_secs(2),
};

/// Blobs held against the shared store's gc, released when dropped.
pub(crate) struct BlobHold {
    silo: Silo,
    holder: String,
}

impl Drop for BlobHold {
    fn drop(&mut self) {
        // Best effort: a hold left behind expires (`HOLD_TTL_MS`).
        if let Err(error) = self.silo.db().release_blobs(&self.holder) {
            tracing::warn!("releasing blobs held by {}: {error}", self.holder);
        }
    }
}

impl Silo {
    /// Puts `digests` of `store` in the fleet's shared store, if there is
    /// one, holding them until the returned hold is dropped: record the
    /// row that names them first.
    pub(crate) async fn publish(
        &self,
        store: &Store,
        digests: &[Digest],
    ) -> Result<Option<BlobHold>, SnapshotError> {
        let Some(shared) = store.shared() else {
            return Ok(None);
        };
        let hold = self.hold(digests).await?;
        let wait = wait();
        let start = Instant::now();
        for digest in digests {
            let mut tries = 0;
            loop {
                match shared.put(store, digest).await {
                    Ok(_) => break,
                    Err(error) if start.elapsed() < wait && worth_waiting(&error) => {
                        if tries == 0 {
                            tracing::warn!("waiting up to {wait:?} for the shared store: {error}");
                        }
                        tokio::time::sleep(jitter(BACKOFF.pause(tries))).await;
                        tries += 1;
                    }
                    Err(error) if worth_waiting(&error) => {
                        return Err(unavailable(shared, wait, error));
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
        Ok(Some(hold))
    }

    /// Records a stored image, its blobs put in the shared store first.
    pub(crate) async fn record_image(
        &self,
        store: &Store,
        image: &StoredImage,
    ) -> Result<(), SnapshotError> {
        let digests = image
            .layers
            .iter()
            .chain([&image.index_blob])
            .map(|d| super::parse_digest(d))
            .collect::<Result<Vec<_>, _>>()?;
        let _hold = self.publish(store, &digests).await?;
        self.db().insert_image(image)?;
        Ok(())
    }

    /// Holds `digests` against the shared store's gc, waiting out a
    /// deletion of one under way (it is sent again after).
    async fn hold(&self, digests: &[Digest]) -> Result<BlobHold, SnapshotError> {
        let mut token = [0u8; 8];
        getrandom::fill(&mut token)
            .map_err(|e| SnapshotError::Task(format!("no randomness for a hold: {e}")))?;
        let holder = format!(
            "{}:{}:{}",
            self.fleet().host,
            std::process::id(),
            hex::encode(token)
        );
        let hold = BlobHold {
            silo: self.clone(),
            holder,
        };
        let mut wanted: Vec<String> = digests.iter().map(ToString::to_string).collect();
        let mut tries = 0;
        while !wanted.is_empty() {
            wanted = self.db().hold_blobs(&hold.holder, &wanted)?;
            if !wanted.is_empty() {
                tokio::time::sleep(jitter(BACKOFF.pause(tries))).await;
                tries += 1;
            }
        }
        Ok(hold)
    }
}

/// `SILO_STORE_WAIT_SECS`, else [`DEFAULT_WAIT`].
fn wait() -> Duration {
    std::env::var(WAIT_ENV)
        .ok()
        .and_then(|secs| secs.trim().parse().ok())
        .map_or(DEFAULT_WAIT, Duration::from_secs)
}

/// A bucket that does not answer may yet; one that refuses will not.
fn worth_waiting(error: &SharedError) -> bool {
    matches!(error, SharedError::Request { .. } | SharedError::Runtime(_))
}

fn unavailable(shared: &SharedStore, waited: Duration, source: SharedError) -> SnapshotError {
    SnapshotError::SharedUnavailable {
        url: shared.url().to_owned(),
        waited,
        source: Box::new(source),
    }
}
