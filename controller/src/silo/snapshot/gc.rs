//! The store's half of `silo gc`: base images no snapshot stands on, blobs
//! nothing names, temp files of interrupted writes, and the engine images
//! of deleted snapshots. It holds the store's exclusive lock, so no
//! snapshot is written while blobs are judged unnamed.

use std::collections::HashSet;

use super::{StoreGc, blocking, engine};
use crate::backend::DockerError;
use crate::silo::{Silo, SiloError};

/// Longest wait for gc's exclusive hold on the store.
const GC_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
                for (digest, size) in store.list()? {
                    if named.contains(digest.as_str()) {
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
}
