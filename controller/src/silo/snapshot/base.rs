//! Base images in the store: an engine image's export, stored once by the
//! first snapshot (or rebase onto the engine) that stands on it and shared
//! by every later one, with its path index and the base id its labels
//! carry; and the paths of an image made of a base and layers above it.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::layer::CountingReader;
use super::{
    BaseStored, SnapshotError, SnapshotProgress, SnapshotProgressFn, engine, ms_since, parse_digest,
};
use crate::backend::EngineImages;
use crate::bridge;
use crate::image::base_id_of;
use crate::silo::Silo;
use crate::state::{StoredImage, now_ms};
use crate::store::{Index, Store, save_archive};

impl Silo {
    /// The base image, stored: from the records when its layers are in the
    /// store already, else exported from the engine into the store now.
    pub(super) async fn store_base_image(
        &self,
        images: &EngineImages,
        store: &Store,
        image_id: &str,
        progress: &SnapshotProgressFn,
    ) -> Result<(StoredImage, Option<BaseStored>), SnapshotError> {
        if let Some(image) = self.complete_image(store, image_id).await? {
            return Ok((image, None));
        }
        let start = Instant::now();
        progress(SnapshotProgress::Step {
            label: "storing the base image",
            total: None,
        });
        let export = images
            .export_image(image_id)
            .await
            .map_err(engine("export the base image"))?;
        let (saved, index) = {
            let store = store.clone();
            let image = image_id.to_owned();
            let progress = Arc::clone(progress);
            bridge::consume_blocking(export, move |reader| {
                let counted = CountingReader {
                    inner: reader,
                    progress,
                };
                let saved = save_archive::ingest(counted, &store)
                    .map_err(|source| SnapshotError::Ingest { image, source })?;
                let mut index = store.writer()?;
                saved.index.write_to(&mut index)?;
                let index = index.finish()?;
                Ok::<_, SnapshotError>((saved, index))
            })
            .await
        }
        .map_err(|e| SnapshotError::Task(e.to_string()))??;
        let labels = &saved.config["config"]["Labels"];
        let identity = base_id_of(
            |name| labels[name].as_str().map(str::to_owned),
            saved.layers.len(),
        );
        let image = StoredImage {
            image_id: image_id.to_owned(),
            identity,
            config: saved.config,
            layers: saved.layers.iter().map(ToString::to_string).collect(),
            index_blob: index.digest.to_string(),
            bytes: saved.bytes_stored + index.size,
            stored_at_ms: now_ms(),
        };
        self.record_image(store, &image).await?;
        let stored = BaseStored {
            image_id: image_id.to_owned(),
            layers: image.layers.len(),
            bytes: image.bytes,
            ms: ms_since(start),
            after_capture: false,
        };
        Ok((image, Some(stored)))
    }
}

/// The paths of an image made of `layers`: the base image's stored index,
/// then each layer above the base's applied in order.
pub(super) fn image_index(
    store: &Store,
    base: &StoredImage,
    layers: &[String],
) -> Result<Index, SnapshotError> {
    let mut index = Index::read_from(store.open_blob(&parse_digest(&base.index_blob)?)?)?;
    if !layers.starts_with(&base.layers) {
        return Err(SnapshotError::Inconsistent(format!(
            "layers do not start with those of image {}",
            base.image_id
        )));
    }
    for layer in &layers[base.layers.len()..] {
        let file = store.open_blob(&parse_digest(layer)?)?;
        index.apply_layer(io::BufReader::new(file))?;
    }
    Ok(index)
}
