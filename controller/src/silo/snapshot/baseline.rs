//! What a machine's first snapshot measures its changes against when the
//! store has no index of the files the machine started with, and, on
//! machines that are not an engine's containers (remote VMs,
//! the agent-layers strategy), how a snapshot's layers go back onto
//! a machine.
//!
//! An **image's listing**: a container made from an image the store lacks
//! would have its first snapshot wait for the engine's export of the whole
//! image (seconds for a few hundred megabytes) before the agent could be
//! asked for anything, since deletions are found against the image's
//! paths. So when the first such container is made, and before anything of
//! the sandbox's runs in it, its agent lists its paths (`POST /v1/index`)
//! into the store as an image with no layers, shared by every container of
//! that image with the same exclusions (a bind mount hides what the image
//! has under it). The first snapshot is captured against the listing and
//! the image is exported after the sandbox runs again. A container with a
//! workload is never listed, since the workload has run by then and a file
//! it deleted would be missing from the listing and so come back in every
//! restore; it uses a listing taken from another container.
//!
//! A provider's template cannot be exported, so its paths come from a fresh
//! machine's agent (`POST /v1/index`) and are stored as an image with no
//! layers, the **template baseline**, shared by every machine of that
//! template with the same base id. Every machine's [`Baseline`] also holds
//! the moment, on the machine's own clock, from which a changed path is the
//! sandbox's: read before the template is listed on a fresh machine, or
//! after the layers are applied on a restored one.
//!
//! A snapshot restores onto a machine only if the machine's files are the
//! ones the snapshot's base had. silo tells by the **base id** its images
//! carry (see [`crate::image`]): a template made from a silo-built image
//! keeps the file [`BASE_ID_PATH`]. A snapshot whose base has no base id
//! restores only onto the template it was taken on.

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use silo_protocol::ErrorKind;
use silo_protocol::index::IndexRequest;

use super::{ImageSource, SnapshotError, blocking, parse_digest, shared_lock};
use crate::backend::ContainerFacts;
use crate::client::{AgentClient, ClientError};
use crate::image::{BAKED_AGENT_PATH, BASE_ID_PATH};
use crate::sandbox::{FileError, Files};
use crate::silo::{Silo, SiloError};
use crate::spec::BackendKind;
use crate::state::{Baseline, SandboxRecord, Snapshot, StoredImage, now_ms};
use crate::store::{Index, Store};

/// How far before the moment read from the machine's clock a file's ctime
/// still counts as changed: file times come from a coarser clock that can
/// lag the one the agent reads. A margin only makes a snapshot larger.
const CLOCK_MARGIN_NS: i64 = 20_000_000;

/// The key of a template baseline's config that says whether the template
/// carries the agent.
const CARRIES_AGENT: &str = "carries_agent";

/// The id of a template baseline: the backend, the template, and the base
/// id (or, for a template without one, its index's digest).
fn template_image_id(backend: BackendKind, template: &str, base: &str) -> String {
    format!("{backend}-template:{template}@{base}")
}

/// The id of the listing of an engine image, taken with `exclude` left out.
pub(super) fn listing_image_id(image_id: &str, exclude: &[String]) -> String {
    let mut exclude = exclude.to_vec();
    exclude.sort();
    let digest = Sha256::digest(exclude.join("\0").as_bytes());
    format!("docker-listing:{image_id}@{}", hex::encode(&digest[..8]))
}

/// Whether `image` is a template baseline of `template` on `backend`.
fn is_baseline_of(image: &StoredImage, backend: BackendKind, template: &str) -> bool {
    image
        .image_id
        .starts_with(&template_image_id(backend, template, ""))
}

impl Silo {
    /// Whether the newest machine silo listed of `sandbox`'s template had
    /// the agent in it (see [`crate::backend::Machine::agent_in_image`]).
    pub(in crate::silo) fn template_carries_agent(&self, sandbox: &SandboxRecord) -> bool {
        let template = sandbox.spec.image.as_deref().unwrap_or_default();
        let prefix = template_image_id(sandbox.backend, template, "");
        match self.db().newest_stored_image_like(&prefix) {
            Ok(image) => image.is_some_and(|image| image.config[CARRIES_AGENT] == true),
            Err(error) => {
                tracing::debug!("looking up what {template} carries: {error}");
                false
            }
        }
    }

    /// Records the baseline of a sandbox's fresh machine: the machine's
    /// clock now, its base id, and its template's paths (listed by the
    /// agent, with `exclude` left out, unless a baseline with the same base
    /// id is stored).
    pub(super) async fn record_fresh_baseline(
        &self,
        sandbox: &SandboxRecord,
        exclude: &[String],
    ) -> Result<SandboxRecord, SiloError> {
        let client = self.client(sandbox)?;
        let agent = agent_error(sandbox);
        let changed_since_ns = machine_clock_ns(&client).await.map_err(&agent)?;
        let base_id = read_base_id(&client, sandbox).await?;
        let template = sandbox.spec.image.as_deref().unwrap_or_default();
        let store = self.store()?;
        let cached = match &base_id {
            Some(id) => {
                let image_id = template_image_id(sandbox.backend, template, id);
                self.complete_image(&store, &image_id).await?
            }
            None => None,
        };
        let image = match cached {
            Some(image) => image,
            None => {
                let request = IndexRequest {
                    exclude: exclude.to_vec(),
                };
                let listed = client.index(&request).await.map_err(&agent)?;
                let _lock = shared_lock(&store).await?;
                let (index_blob, bytes, carries_agent) = store_index(&store, listed).await?;
                let base = base_id
                    .clone()
                    .unwrap_or_else(|| format!("index-{index_blob}"));
                let image = StoredImage {
                    image_id: template_image_id(sandbox.backend, template, &base),
                    config: serde_json::json!({ CARRIES_AGENT: carries_agent }),
                    layers: Vec::new(),
                    index_blob,
                    bytes,
                    stored_at_ms: now_ms(),
                    identity: base_id,
                };
                self.record_image(&store, &image).await?;
                image
            }
        };
        let baseline = Baseline {
            image: image.image_id,
            changed_since_ns,
        };
        Ok(self.db().set_baseline(sandbox, &baseline)?)
    }

    /// Records the listing of a fresh container's image as its baseline
    /// when the store lacks the image (see the module docs), listing the
    /// container (as the engine's `facts` of it say) if no other was; the
    /// sandbox as it was when the listing is not needed or cannot be taken.
    pub(super) async fn record_listing(
        &self,
        sandbox: &SandboxRecord,
        facts: ContainerFacts,
    ) -> Result<SandboxRecord, SiloError> {
        let store = self.store()?;
        if self
            .complete_image(&store, &facts.image_id)
            .await?
            .is_some()
        {
            return Ok(sandbox.clone());
        }
        let image_id = listing_image_id(&facts.image_id, &facts.exclude);
        // Held until the sandbox's row names the listing, so gc cannot
        // forget it in between.
        let _lock = shared_lock(&store).await?;
        if self.complete_image(&store, &image_id).await?.is_none() {
            let spec = &sandbox.spec;
            if !spec.workload.is_empty() || spec.workload_from_image {
                return Ok(sandbox.clone());
            }
            let request = IndexRequest {
                exclude: facts.exclude,
            };
            let listed = self
                .client(sandbox)?
                .index(&request)
                .await
                .map_err(agent_error(sandbox))?;
            let (index_blob, bytes, _) = store_index(&store, listed).await?;
            let image = StoredImage {
                image_id: image_id.clone(),
                config: serde_json::json!({}),
                layers: Vec::new(),
                index_blob,
                bytes,
                stored_at_ms: now_ms(),
                identity: None,
            };
            self.record_image(&store, &image).await?;
        }
        let baseline = Baseline {
            image: image_id,
            changed_since_ns: facts.created_ns,
        };
        Ok(self.db().set_baseline(sandbox, &baseline)?)
    }

    /// Puts a snapshot's layers above its base onto a sandbox's machine,
    /// fresh from its template, after checking that the machine's files are
    /// the base's; then records the machine's baseline. On failure the
    /// caller removes the machine.
    pub(super) async fn apply_snapshot(
        &self,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
    ) -> Result<(SandboxRecord, ImageSource), SiloError> {
        let base = self.base_of(snapshot)?;
        let client = self.client(sandbox)?;
        let template = sandbox.spec.image.as_deref().unwrap_or_default();
        let found = read_base_id(&client, sandbox).await?;
        let same = match &base.identity {
            Some(id) => found.as_deref() == Some(id.as_str()),
            None => is_baseline_of(&base, sandbox.backend, template),
        };
        if !same {
            return Err(SnapshotError::BaseMismatch {
                snapshot: snapshot.id.clone(),
                base: base.image_id.clone(),
                base_id: base.identity.clone(),
                target: format!("template {template:?}"),
                found,
            }
            .into());
        }
        let store = self.store()?;
        let agent = agent_error(sandbox);
        let (mut layers, mut sent) = (0, 0);
        for layer in snapshot.layers.iter().skip(base.layers.len()) {
            let digest = parse_digest(layer)?;
            let read = store.clone();
            let bytes = blocking(move || {
                let mut file = read.open_blob(&digest)?;
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|source| {
                    SnapshotError::Layer {
                        name: format!("store blob {digest}"),
                        source,
                    }
                })?;
                Ok(Bytes::from(bytes))
            })
            .await?;
            sent += bytes.len() as u64;
            layers += 1;
            client.apply_layer(bytes).await.map_err(&agent)?;
        }
        let changed_since_ns = machine_clock_ns(&client).await.map_err(&agent)?;
        let baseline = Baseline {
            image: base.image_id,
            changed_since_ns,
        };
        let sandbox = self.db().set_baseline(sandbox, &baseline)?;
        Ok((
            sandbox,
            ImageSource::Applied {
                layers,
                bytes: sent,
            },
        ))
    }
}

/// The machine's clock (unix ns, less the margin), as its agent reads it.
async fn machine_clock_ns(client: &AgentClient) -> Result<i64, ClientError> {
    let health = client.healthz().await?;
    let ms = health.unix_ms.ok_or_else(|| {
        ClientError::Protocol(
            "the agent does not report its clock (it predates snapshots on remote machines)".into(),
        )
    })?;
    Ok(ms.saturating_mul(1_000_000).saturating_sub(CLOCK_MARGIN_NS))
}

/// The base id in the machine's files, or `None` if it has none.
async fn read_base_id(
    client: &AgentClient,
    sandbox: &SandboxRecord,
) -> Result<Option<String>, SiloError> {
    match Files::new(client.clone()).read(BASE_ID_PATH).await {
        Ok(text) => Ok(Some(String::from_utf8_lossy(&text).trim().to_owned())),
        Err(FileError::Refused {
            kind: ErrorKind::NotFound,
            ..
        }) => Ok(None),
        Err(source) => Err(SnapshotError::BaseIdUnreadable {
            name: sandbox.name.clone(),
            source: Box::new(source),
        }
        .into()),
    }
}

/// Stores a machine's path listing as an index blob; its digest and size,
/// and whether the machine has the agent where `silo image bake` puts it.
async fn store_index(store: &Store, listed: Bytes) -> Result<(String, u64, bool), SnapshotError> {
    let store = store.clone();
    blocking(move || {
        let index = Index::from_paths(&listed)?;
        let carries_agent = index.contains(BAKED_AGENT_PATH.trim_start_matches('/'));
        let mut writer = store.writer()?;
        index.write_to(&mut writer)?;
        let written = writer.finish()?;
        Ok((written.digest.to_string(), written.size, carries_agent))
    })
    .await
}

pub(super) fn agent_error(sandbox: &SandboxRecord) -> impl Fn(ClientError) -> SnapshotError + '_ {
    move |source| SnapshotError::Agent {
        name: sandbox.name.clone(),
        source: Box::new(source),
    }
}
