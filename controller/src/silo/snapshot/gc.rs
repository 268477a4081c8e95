//! The store's half of `silo gc`: base images no snapshot stands on, blobs
//! nothing names, temp files of interrupted writes, and the engine images
//! of deleted snapshots. It holds the store's exclusive lock, so no
//! snapshot is written while blobs are judged unnamed.
//!
//! With a fleet's shared store, this home's store is its cache: past
//! `SILO_CACHE_BYTES` the least recently read blobs go (the bucket keeps
//! them). The bucket's own unnamed blobs go too, through the state's holds
//! and deletions (see the state's `blobs`), so a snapshot another host is
//! recording never loses one.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::{SnapshotError, StoreGc, blocking, engine};
use crate::backend::DockerError;
use crate::silo::{Silo, SiloError};
use crate::store::{Digest, SharedStore};

/// Longest wait for gc's exclusive hold on the store.
const GC_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The bound on this home's cache of a shared store, in bytes.
pub const CACHE_BYTES_ENV: &str = "SILO_CACHE_BYTES";
/// That bound when unset: 20 GiB.
const DEFAULT_CACHE_BYTES: u64 = 20 << 30;

impl Silo {
    /// The store's part of gc: forgets base images no snapshot stands on,
    /// removes blobs nothing names and temp files of interrupted writes,
    /// and the engine images of deleted snapshots.
    pub async fn gc_store(&self, dry_run: bool) -> Result<StoreGc, SiloError> {
        // No snapshot was ever taken here: nothing to collect, and no store
        // to make just to find that out.
        if !self.home().store_dir().exists() {
            return Ok(StoreGc::default());
        }
        let store = self.store()?;
        let lock = {
            let store = store.clone();
            blocking(move || Ok(store.exclusive_lock(GC_LOCK_WAIT)?)).await?
        };
        let mut report = StoreGc::default();
        if !dry_run {
            report.images_forgotten = self.db().forget_unused_images()?;
        }
        let named = self.db().named_blobs()?;
        let report = {
            let store = store.clone();
            blocking(move || {
                let mut kept = Vec::new();
                for (digest, size) in store.list()? {
                    if named.contains(digest.as_str()) {
                        kept.push((digest, size));
                        continue;
                    }
                    if dry_run || store.remove(&digest, &lock)? {
                        report.blobs_removed += 1;
                        report.bytes_freed += size;
                    }
                }
                if !dry_run {
                    report.temps_removed = store.sweep_temps(&lock)?;
                }
                // A named blob is in the bucket (it was put there before
                // its row was recorded): the cache may let it go.
                if store.shared().is_some() {
                    let over = evictable(&store, kept, cache_bytes())?;
                    for (digest, size) in over {
                        if dry_run || store.remove(&digest, &lock)? {
                            report.cache_evicted += 1;
                            report.cache_bytes_evicted += size;
                        }
                    }
                }
                Ok(report)
            })
            .await?
        };
        let mut report = report;
        let known: HashSet<String> = self
            .db()
            .snapshots(None)?
            .into_iter()
            .map(|s| s.id)
            .collect();
        for engine_images in self.backends().engines() {
            match engine_images.snapshot_images().await {
                Ok(images) => {
                    for image in images.into_iter().filter(|i| !known.contains(&i.snapshot)) {
                        if dry_run
                            || engine_images
                                .remove_image(&image.image_id)
                                .await
                                .map_err(engine("remove a snapshot image"))?
                        {
                            report.engine_images_removed.push(image.image_id);
                        }
                    }
                }
                Err(DockerError::Unreachable { .. } | DockerError::Unresponsive { .. }) => {}
                Err(error) => return Err(engine("list snapshot images")(error).into()),
            }
        }
        Ok(report)
    }

    /// The shared store's part of gc: its blobs that nothing names, put
    /// there at least `grace` ago, deleted under the state's deletions.
    pub async fn gc_shared_store(
        &self,
        grace: Duration,
        dry_run: bool,
        report: &mut StoreGc,
    ) -> Result<(), SiloError> {
        let Some(shared) = self.shared_store() else {
            return Ok(());
        };
        let cutoff = SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let listed = shared.list().await.map_err(SnapshotError::from)?;
        let old: Vec<_> = listed
            .into_iter()
            .filter(|b| b.modified <= cutoff)
            .collect();
        let sizes: std::collections::HashMap<String, u64> =
            old.iter().map(|b| (b.digest.to_string(), b.size)).collect();
        let candidates: Vec<String> = sizes.keys().cloned().collect();
        let doomed = if dry_run {
            let named = self.db().named_blobs()?;
            candidates
                .into_iter()
                .filter(|d| !named.contains(d))
                .collect()
        } else {
            self.db().doom_blobs(&candidates)?
        };
        if !dry_run {
            let deleted = delete_all(shared, &doomed).await;
            self.db().forget_deletions(&doomed)?;
            deleted.map_err(SnapshotError::from)?;
        }
        report.shared_blobs_removed = doomed.len();
        report.shared_bytes_freed = doomed.iter().filter_map(|d| sizes.get(d)).sum();
        Ok(())
    }
}

/// Deletes each of `digests` from the bucket, going on past a failure
/// (answered after, the first one).
async fn delete_all(
    shared: &SharedStore,
    digests: &[String],
) -> Result<(), crate::store::SharedError> {
    let mut first = None;
    for digest in digests {
        let Ok(digest) = Digest::parse(digest) else {
            continue;
        };
        if let Err(error) = shared.delete(&digest).await {
            first.get_or_insert(error);
        }
    }
    first.map_or(Ok(()), Err)
}

/// `SILO_CACHE_BYTES`, else 20 GiB.
fn cache_bytes() -> u64 {
    std::env::var(CACHE_BYTES_ENV)
        .ok()
        .and_then(|bytes| bytes.trim().parse().ok())
        .unwrap_or(DEFAULT_CACHE_BYTES)
}

/// Of the cached blobs `kept`, those to let go so the rest fit in
/// `bound`: the least recently read first.
fn evictable(
    store: &crate::store::Store,
    kept: Vec<(Digest, u64)>,
    bound: u64,
) -> Result<Vec<(Digest, u64)>, SnapshotError> {
    let total: u64 = kept.iter().map(|(_, size)| size).sum();
    if total <= bound {
        return Ok(Vec::new());
    }
    let mut by_use = Vec::with_capacity(kept.len());
    for (digest, size) in kept {
        by_use.push((store.last_read(&digest)?, digest, size));
    }
    by_use.sort();
    let mut over = total - bound;
    let mut out = Vec::new();
    for (_, digest, size) in by_use {
        if over == 0 {
            break;
        }
        over = over.saturating_sub(size);
        out.push((digest, size));
    }
    Ok(out)
}
