//! What the snapshot engine does with each [`SnapshotWay`] a backend hands
//! out (`Backend::snapshots`): engine images (the backend's
//! [`crate::backend::EngineImages`]: a snapshot goes back onto the engine as
//! an image its new machine is made from) or agent layers (a provider's
//! template silo cannot export: its paths are listed by a fresh machine's
//! agent, and a snapshot goes back as layers the agent applies onto a fresh
//! machine from the template).
//!
//! This is the one place the snapshot engine tells the two apart: the rest
//! of it asks the sandbox's way (`Silo::strategy`), never a backend's kind
//! or capabilities, and no backend is asked anything but its way. What the
//! way knows of a machine (its container's facts from the engine, or its
//! recorded baseline, and the paths its snapshots leave out) it answers as
//! values: where a machine started, for a capture ([`StartPoint`]) or a
//! rewind in place ([`MachineStart`]); the steps that follow are the
//! engine's (`take`'s `Snapshotter`, `in_place`).

use serde_json::Value;
use silo_protocol::auth::Key;
use silo_protocol::snapshot::{SnapshotRequest, WalkHint};

use super::in_place::NotInPlace;
use super::remembered;
use super::take::CTIME_MARGIN_NS;
use super::{ForkTarget, ImageSource, SnapshotError, SnapshotProgress, SnapshotProgressFn};
use crate::CreateRequest;
use crate::backend::{
    Backend, BackendError, ContainerFacts, EngineImages, Machine, SnapshotWay, UpperLayer,
};
use crate::silo::{Silo, SiloError, backend_error, machine};
use crate::spec::{BackendKind, SandboxSpec};
use crate::state::{Baseline, EventKind, SandboxRecord, Snapshot, StoredImage};

/// Where a machine started, for a rewind in place (see `in_place`).
pub(super) struct MachineStart {
    /// Unix ns on the machine's clock from which a changed path is the
    /// sandbox's.
    pub started_ns: i64,
    /// Paths a snapshot leaves out.
    pub exclude: Vec<String>,
    /// The stored image its files came from.
    pub image_id: String,
    /// Where changes can be, when the host can tell (see `walk_hint`).
    pub walk_hint: Option<WalkHint>,
}

/// Where a machine started, as a snapshot of it measures changes.
pub(super) struct StartPoint {
    /// The image its files came from (which a snapshot building on no
    /// other stands on).
    pub(super) image: StartImage,
    /// What counts as changed (the baseline is filled in later).
    pub(super) request: SnapshotRequest,
}

/// The image a machine's files came from, as its way knows it.
pub(super) enum StartImage {
    /// An image of this engine's, which the store may lack: the engine
    /// exports it, and until then the image's listing taken with `exclude`
    /// left out (see `baseline`) may stand in for its paths.
    Engine {
        /// The engine that holds it.
        images: EngineImages,
        /// The engine's id of it.
        image_id: String,
        /// The paths the container's listing left out.
        exclude: Vec<String>,
    },
    /// Recorded in the store when the machine was made (a template's
    /// baseline).
    Stored(StoredImage),
}

/// What the engine says of a sandbox's container that its snapshots need;
/// `action` names the operation in an error.
async fn container_facts(
    images: &EngineImages,
    silo: &Silo,
    sandbox: &SandboxRecord,
    action: &'static str,
) -> Result<ContainerFacts, SiloError> {
    let key = silo.sandbox_key(sandbox);
    images
        .container_facts(machine(sandbox, &key))
        .await
        .map_err(|e| backend_error(action, sandbox, BackendError::from(e)))
}

/// The walk hint of a container's upper layer, read now (on the blocking
/// pool); `None` without one.
async fn walk_hint(upper: Option<UpperLayer>) -> Option<WalkHint> {
    let upper = upper?;
    tokio::task::spawn_blocking(move || upper.hint(CTIME_MARGIN_NS))
        .await
        .ok()
        .flatten()
}

impl Silo {
    /// The strategy for `kind`'s machines, from what its backend hands
    /// out; `None` when they have no snapshots (the agent is not PID 1 of a
    /// private root file system, so there is nothing whole to capture).
    pub(in crate::silo) fn strategy(&self, kind: BackendKind) -> Option<SnapshotWay> {
        self.backend(kind).snapshots()
    }

    /// The strategy for the sandbox's machines, or why it has none.
    pub(super) fn strategy_of(
        &self,
        sandbox: &SandboxRecord,
    ) -> Result<SnapshotWay, SnapshotError> {
        self.strategy(sandbox.backend)
            .ok_or_else(|| SnapshotError::Unsupported {
                name: sandbox.name.clone(),
                backend: sandbox.backend,
            })
    }
}

/// Records that `sandbox` now runs (or is about to) from `snapshot`, with no
/// machine until the new one is recorded.
fn rewound(
    silo: &Silo,
    sandbox: &SandboxRecord,
    snapshot: &Snapshot,
    detail: Value,
) -> Result<SandboxRecord, SiloError> {
    let spec = &sandbox.spec;
    Ok(silo.db().replace_machine(
        sandbox,
        spec,
        Some(&snapshot.id),
        (EventKind::Rewound, detail),
    )?)
}

impl SnapshotWay {
    /// Records what a fresh machine's first snapshot will be measured
    /// against: a remote VM's baseline, a container's own listing.
    pub(in crate::silo) async fn record_start(
        &self,
        silo: &Silo,
        sandbox: &SandboxRecord,
    ) -> Result<SandboxRecord, SiloError> {
        match self {
            SnapshotWay::AgentLayers(layers) => {
                silo.record_fresh_baseline(sandbox, &layers.exclude).await
            }
            SnapshotWay::EngineImages(images) => {
                let facts = container_facts(images, silo, sandbox, "inspect").await?;
                silo.record_listing(sandbox, facts).await
            }
        }
    }

    /// Where the sandbox's machine started, as a rewind in place measures
    /// it: a container's facts from the engine (remembered), a VM's
    /// recorded baseline.
    pub(super) async fn machine_start(
        &self,
        silo: &Silo,
        sandbox: &SandboxRecord,
    ) -> Result<MachineStart, NotInPlace> {
        match self {
            SnapshotWay::EngineImages(images) => {
                let facts = match remembered::facts(sandbox) {
                    Some(facts) => facts,
                    None => {
                        let facts = container_facts(images, silo, sandbox, "rewind").await?;
                        remembered::remember_facts(sandbox, facts)
                    }
                };
                Ok(MachineStart {
                    started_ns: facts.created_ns.saturating_sub(CTIME_MARGIN_NS),
                    exclude: facts.exclude.clone(),
                    image_id: facts.image_id.clone(),
                    walk_hint: walk_hint(facts.upper.clone()).await,
                })
            }
            SnapshotWay::AgentLayers(layers) => {
                let baseline = sandbox.baseline.as_ref().ok_or_else(|| {
                    NotInPlace(format!(
                        "sandbox {} has no record of the files its machine started with",
                        sandbox.name
                    ))
                })?;
                Ok(MachineStart {
                    // Read from the machine's clock, the margin already off.
                    started_ns: baseline.changed_since_ns,
                    exclude: layers.exclude.clone(),
                    image_id: baseline.image.clone(),
                    walk_hint: None,
                })
            }
        }
    }

    /// The baseline a sandbox keeps after a rewind in place: a container's
    /// files are then the snapshot's, on a stored image, so the listing it
    /// may have started from is needed no more; a VM's baseline still says
    /// when its machine started and on what, which every later snapshot
    /// measures from.
    pub(super) fn baseline_after_in_place(&self, sandbox: &SandboxRecord) -> Option<Baseline> {
        match self {
            SnapshotWay::EngineImages(_) => None,
            SnapshotWay::AgentLayers(_) => sandbox.baseline.clone(),
        }
    }

    /// Where the sandbox's machine started, for a snapshot of it: the
    /// request's fields that say what counts as changed, and the image its
    /// files came from (which the snapshot engine stores when a snapshot
    /// stands on it and the store lacks it).
    pub(super) async fn start_point(
        &self,
        silo: &Silo,
        sandbox: &SandboxRecord,
    ) -> Result<StartPoint, SiloError> {
        match self {
            SnapshotWay::EngineImages(images) => {
                let facts = container_facts(images, silo, sandbox, "snapshot").await?;
                let hint = walk_hint(facts.upper.clone()).await;
                let request = SnapshotRequest {
                    changed_since_ns: facts.created_ns.saturating_sub(CTIME_MARGIN_NS),
                    // Agents walk every directory: no subtree is skipped
                    // on its parent's times (an older agent is told so).
                    prune_unchanged_dirs: false,
                    descend_since_ns: None,
                    exclude: facts.exclude.clone(),
                    baseline: Vec::new(),
                    baseline_raw: Vec::new(),
                    baseline_digest: None,
                    walk_hint: hint,
                    rewind_to: None,
                    block_sums: false,
                };
                let image = StartImage::Engine {
                    images: images.clone(),
                    image_id: facts.image_id,
                    exclude: facts.exclude,
                };
                Ok(StartPoint { image, request })
            }
            SnapshotWay::AgentLayers(layers) => {
                let baseline =
                    sandbox
                        .baseline
                        .clone()
                        .ok_or_else(|| SnapshotError::NoBaseline {
                            name: sandbox.name.clone(),
                        })?;
                let base = silo.db().stored_image(&baseline.image)?.ok_or_else(|| {
                    SnapshotError::Inconsistent(format!(
                        "sandbox {} starts from image {}, which is not stored",
                        sandbox.name, baseline.image
                    ))
                })?;
                let request = SnapshotRequest {
                    changed_since_ns: baseline.changed_since_ns,
                    prune_unchanged_dirs: false,
                    descend_since_ns: None,
                    exclude: layers.exclude.clone(),
                    baseline: Vec::new(),
                    baseline_raw: Vec::new(),
                    baseline_digest: None,
                    walk_hint: None,
                    rewind_to: None,
                    block_sums: false,
                };
                Ok(StartPoint {
                    image: StartImage::Stored(base),
                    request,
                })
            }
        }
    }

    /// Replaces a sandbox's machine with one made from `snapshot`, keeping
    /// its row; answers the sandbox as recorded and where its files came from.
    pub(super) async fn restore(
        &self,
        silo: &Silo,
        sandbox: &SandboxRecord,
        snapshot: &Snapshot,
        key: &Key,
        detail: Value,
        progress: &SnapshotProgressFn,
    ) -> Result<(SandboxRecord, ImageSource), SiloError> {
        match self {
            SnapshotWay::AgentLayers(_) => {
                progress(SnapshotProgress::Step {
                    label: "starting",
                    total: None,
                });
                // The old machine goes first, by its own handle (a
                // provider's create would find and remove it anyway); the
                // row then has no machine until the new one is recorded.
                let backend = silo.backend_of(sandbox)?;
                backend
                    .remove(machine(sandbox, key))
                    .await
                    .map_err(|e| backend_error("remove", sandbox, e))?;
                let sandbox = rewound(silo, sandbox, snapshot, detail)?;
                let made = backend.create(silo.machine_to_make(&sandbox, key)).await;
                let sandbox = silo.record_made(&sandbox, made).await?;
                silo.apply_or_remove(sandbox, snapshot, progress).await
            }
            SnapshotWay::EngineImages(images) => {
                let store = silo.store()?;
                let (image_id, source) = silo
                    .load_snapshot_image(images, &store, snapshot, None, progress)
                    .await?;
                let sandbox = rewound(silo, sandbox, snapshot, detail)?;
                progress(SnapshotProgress::Step {
                    label: "starting",
                    total: None,
                });
                let made = Machine {
                    image: Some(&image_id),
                    ..machine(&sandbox, key)
                };
                let made = images.replace(made).await.map_err(BackendError::from);
                let sandbox = silo.record_made(&sandbox, made).await?;
                silo.fill_engine_gaps(&sandbox, snapshot).await?;
                Ok((sandbox, source))
            }
        }
    }

    /// Makes the new sandbox `name` of a fork from `snapshot`, with `spec`
    /// (the snapshot's, onto the backend and image `target` asks for).
    pub(super) async fn fork(
        &self,
        silo: &Silo,
        snapshot: &Snapshot,
        mut spec: SandboxSpec,
        name: &str,
        target: &ForkTarget,
        progress: &SnapshotProgressFn,
    ) -> Result<(SandboxRecord, ImageSource), SiloError> {
        let request = |spec| CreateRequest {
            name: Some(name.to_owned()),
            spec,
        };
        match self {
            SnapshotWay::EngineImages(images) => {
                let store = silo.store()?;
                // A snapshot taken on a template, or asked onto another
                // image, goes onto the engine image with its base id.
                let image = target.image.as_deref();
                let rebased = silo
                    .rebase_onto_engine(images, &store, snapshot, image, progress)
                    .await?;
                if let Some(rebased) = &rebased {
                    spec.image = rebased.spec.image.clone();
                } else if spec.image.is_none() {
                    // Taken elsewhere on a machine that already stands on an
                    // engine image (an E2B VM forked from a Docker snapshot):
                    // that image is the one to stand on.
                    spec.image = Some(silo.base_of(snapshot)?.image_id);
                }
                spec.check()?;
                let on_engine = rebased.as_ref().unwrap_or(snapshot);
                let (image_id, source) =
                    silo.load_as_is(images, &store, on_engine, progress).await?;
                progress(SnapshotProgress::Step {
                    label: "starting",
                    total: None,
                });
                let sandbox = silo.reserve(request(spec), Some(snapshot.id.clone()))?;
                let sandbox = silo.launch(sandbox, Some(&image_id)).await?;
                match silo.fill_engine_gaps(&sandbox, on_engine).await {
                    Ok(()) => Ok((sandbox, source)),
                    Err(error) => {
                        silo.remove_failed_machine(&sandbox).await;
                        Err(silo.forget_failed(&sandbox, "fork", error)?)
                    }
                }
            }
            SnapshotWay::AgentLayers(_) => {
                spec.check()?;
                progress(SnapshotProgress::Step {
                    label: "starting",
                    total: None,
                });
                let sandbox = silo.reserve(request(spec), Some(snapshot.id.clone()))?;
                let sandbox = silo.launch(sandbox, None).await?;
                match silo
                    .apply_or_remove(sandbox.clone(), snapshot, progress)
                    .await
                {
                    Ok(applied) => Ok(applied),
                    Err(error) => Err(silo.forget_failed(&sandbox, "fork", error)?),
                }
            }
        }
    }
}
