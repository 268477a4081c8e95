//! What snapshots need from the engine, and nothing more: facts about a
//! sandbox's container (the image it runs, when it was made, whether its
//! file system is an overlay), an image's export (`GET /images/{id}/get`) to
//! store a base image's layers once, an import (`POST /images/load`) to put
//! a snapshot back on the engine, and the images silo loaded, for gc.
//!
//! The snapshot itself is taken by the sandbox's agent, not the engine: on
//! an engine whose storage driver diffs by walking the whole image (the
//! `fuse-overlayfs` and `vfs` drivers, and `docker commit` on any of them),
//! asking the engine costs what the image weighs. Bodies are streamed both
//! ways, never buffered whole, with the long request timeout, since a base
//! image can take longer than the usual timeout to export or import.

use std::collections::HashMap;

use bollard::query_parameters::{
    ImportImageOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::UpperLayer;
use super::engine::LONG_REQUEST_TIMEOUT;
use super::error::{DockerError, api, is_conflict, is_not_found};
use super::{DockerBackend, config};
use crate::backend::Machine;
use crate::backend::labels::LABEL_HOME;
use crate::timestamp::rfc3339_to_unix_ns;

/// Label on every image silo loads for a snapshot: the snapshot's id.
pub const LABEL_SNAPSHOT: &str = "silo.snapshot";
/// Repository under which snapshot images are tagged (`silo-snapshot:<id>`).
pub const SNAPSHOT_REPOSITORY: &str = "silo-snapshot";

/// The labels a snapshot's image config carries: its snapshot's id and the
/// home that owns it, by which gc finds the images this home loaded. Handed
/// to the snapshot engine as a value, so it writes them into every
/// snapshot's config knowing no label's name.
#[derive(Debug, Clone)]
pub struct SnapshotLabels {
    home_id: String,
}

impl SnapshotLabels {
    /// The labels of the home whose identity is `home_id`.
    pub fn new(home_id: String) -> Self {
        Self { home_id }
    }

    /// The labels of snapshot `id`'s image, in the order they are written.
    pub fn of(&self, id: &str) -> [(&'static str, String); 2] {
        [
            (LABEL_SNAPSHOT, id.to_owned()),
            (LABEL_HOME, self.home_id.clone()),
        ]
    }
}

/// What a snapshot needs to know about a sandbox's container.
#[derive(Debug, Clone)]
pub struct ContainerFacts {
    /// The engine's id of the image the container was made from.
    pub image_id: String,
    /// When the container was made (unix ns): its image was complete before,
    /// and none of its processes had run.
    pub created_ns: i64,
    /// Paths a snapshot leaves out: silo's and the engine's own mounts.
    pub exclude: Vec<String>,
    /// Its overlay's upper layer, where the host can read it: the walk
    /// hint of its snapshots and rewinds.
    pub upper: Option<UpperLayer>,
}

/// The engine-images snapshot strategy's half on the engine: what the
/// snapshot engine may do with the engine a backend makes its machines
/// from, handed out by [`crate::backend::Backend::engine_images`]. Snapshot
/// code holds this, never the backend.
#[derive(Debug, Clone)]
pub struct EngineImages(pub(super) DockerBackend);

impl EngineImages {
    /// Makes `machine`'s machine again from `machine.image`, keeping the
    /// sandbox's directory (a rewind or restore).
    pub async fn replace(&self, machine: Machine<'_>) -> Result<serde_json::Value, DockerError> {
        self.0.replace(machine).await
    }

    /// The labels of this home's snapshot images, as the images it loads
    /// carry them.
    pub fn snapshot_labels(&self) -> Result<SnapshotLabels, DockerError> {
        Ok(SnapshotLabels::new(self.0.home_id()?))
    }

    /// The container backend on this engine, for image builds on it.
    pub(crate) fn backend(&self) -> DockerBackend {
        self.0.clone()
    }

    /// The backend whose machines this engine holds.
    pub fn kind(&self) -> crate::spec::BackendKind {
        self.0.flavor().kind
    }

    /// The tag a snapshot's image is loaded under.
    pub fn snapshot_tag(&self, snapshot: &str) -> String {
        snapshot_tag(snapshot)
    }
}

/// An image this home loaded for a snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotImage {
    /// The engine's image id.
    pub image_id: String,
    /// The snapshot it was loaded for.
    pub snapshot: String,
}

impl EngineImages {
    /// The facts about the sandbox's container a snapshot needs.
    pub async fn container_facts(
        &self,
        machine: Machine<'_>,
    ) -> Result<ContainerFacts, DockerError> {
        let engine = self.0.engine().await?;
        let name = super::container_name(machine.id);
        let info = self.0.ours(engine, &machine).await?;
        let image_id = info.image.clone().unwrap_or_default();
        let created_ns = info
            .created
            .as_deref()
            .and_then(rfc3339_to_unix_ns)
            .ok_or_else(|| DockerError::Unexpected {
                what: format!("container {name} has no readable creation time"),
            })?;
        Ok(ContainerFacts {
            image_id,
            created_ns,
            exclude: config::snapshot_excludes(machine.spec),
            upper: UpperLayer::of(info.graph_driver.as_ref()),
        })
    }

    /// The layers (diff ids, bottom first) of an image on the engine, or
    /// `None` if the engine does not have it.
    pub async fn image_layers(&self, image: &str) -> Result<Option<Vec<String>>, DockerError> {
        let engine = self.0.engine().await?;
        match engine.inspect_image(image).await {
            Ok(found) => Ok(Some(
                found.root_fs.and_then(|r| r.layers).unwrap_or_default(),
            )),
            Err(error) if is_not_found(&error) => Ok(None),
            Err(error) => Err(api(format!("inspect image {image}"))(error)),
        }
    }

    /// The engine's export of one image (the `docker save` archive), as it
    /// streams.
    pub async fn export_image(
        &self,
        image: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, DockerError>> + use<>, DockerError> {
        let engine = self
            .0
            .engine()
            .await?
            .clone()
            .with_timeout(LONG_REQUEST_TIMEOUT);
        let what = format!("export image {image}");
        Ok(engine
            .export_image(image)
            .map(move |chunk| chunk.map_err(api(what.clone()))))
    }

    /// Loads an image archive (the `docker load` format) streamed from `body`.
    pub async fn load_image<S>(&self, body: S) -> Result<(), DockerError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let engine = self
            .0
            .engine()
            .await?
            .clone()
            .with_timeout(LONG_REQUEST_TIMEOUT);
        let options = ImportImageOptionsBuilder::new().quiet(true).build();
        let mut progress = engine.import_image_stream(options, body, None);
        while let Some(step) = progress.next().await {
            step.map_err(api("load a snapshot image"))?;
        }
        Ok(())
    }

    /// Removes an image silo loaded. Returns whether it was removed: one a
    /// container still runs from stays, and so does one already gone.
    pub async fn remove_image(&self, image: &str) -> Result<bool, DockerError> {
        let engine = self.0.engine().await?;
        let options = RemoveImageOptionsBuilder::new().force(false).build();
        match engine.remove_image(image, Some(options), None).await {
            Ok(_) => Ok(true),
            Err(error) if is_not_found(&error) || is_conflict(&error) => Ok(false),
            Err(error) => Err(api(format!("remove image {image}"))(error)),
        }
    }

    /// Every image this home loaded for a snapshot.
    pub async fn snapshot_images(&self) -> Result<Vec<SnapshotImage>, DockerError> {
        let engine = self.0.engine().await?;
        let filters: HashMap<String, Vec<String>> = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_HOME}={}", self.0.home_id()?)],
        )]);
        let options = ListImagesOptionsBuilder::new().filters(&filters).build();
        let images = engine
            .list_images(Some(options))
            .await
            .map_err(api("list snapshot images"))?;
        Ok(images
            .into_iter()
            .filter_map(|image| {
                let snapshot = image.labels.get(LABEL_SNAPSHOT)?.clone();
                Some(SnapshotImage {
                    image_id: image.id,
                    snapshot,
                })
            })
            .collect())
    }
}

impl EngineImages {
    /// An image's engine id and the base id it carries (see
    /// [`crate::image::BASE_ID_LABEL`]), if any; an image the engine lacks
    /// is an error.
    pub async fn image_base_id(
        &self,
        image: &str,
    ) -> Result<(String, Option<String>), DockerError> {
        let engine = self.0.engine().await?;
        let found = engine
            .inspect_image(image)
            .await
            .map_err(api(format!("inspect image {image}")))?;
        let layers = found
            .root_fs
            .as_ref()
            .and_then(|r| r.layers.as_ref())
            .map_or(0, Vec::len);
        let labels = found.config.and_then(|c| c.labels).unwrap_or_default();
        let base_id = crate::image::base_id_of(|name| labels.get(name).cloned(), layers);
        Ok((found.id.unwrap_or_default(), base_id))
    }

    /// The images on the engine that carry `base_id` (with the files it was
    /// given with: see [`crate::image::base_id_of`]), snapshot images left
    /// out (they inherit their base's labels): each one's id and first tag.
    pub async fn images_with_base_id(
        &self,
        base_id: &str,
    ) -> Result<Vec<(String, Option<String>)>, DockerError> {
        let engine = self.0.engine().await?;
        let filters: HashMap<String, Vec<String>> = HashMap::from([(
            "label".to_owned(),
            vec![format!("{}={base_id}", crate::image::BASE_ID_LABEL)],
        )]);
        let options = ListImagesOptionsBuilder::new().filters(&filters).build();
        let images = engine
            .list_images(Some(options))
            .await
            .map_err(api("list images by base id"))?;
        let mut found = Vec::new();
        for image in images {
            if image.labels.contains_key(LABEL_SNAPSHOT) {
                continue;
            }
            let (id, carried) = self.image_base_id(&image.id).await?;
            if carried.as_deref() == Some(base_id) {
                found.push((id, image.repo_tags.into_iter().next()));
            }
        }
        Ok(found)
    }
}

/// The tag a snapshot's image carries on the engine.
pub fn snapshot_tag(snapshot: &str) -> String {
    format!("{SNAPSHOT_REPOSITORY}:{snapshot}")
}
