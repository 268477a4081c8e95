//! Open-or-create (`silo up`): give me the sandbox called NAME, reusing
//! what exists when that is safe, from any process.
//!
//! The tiers, tried in order under the sandbox's lease:
//! 1. its machine exists: attach if it is running (its agent answers), or
//!    start it if it is stopped, unless its idle TTL has expired (then it
//!    counts as gone);
//! 2. it is gone: restore it from its latest snapshot, keeping its id;
//! 3. nothing reusable: make a fresh machine (a new sandbox, or a new
//!    machine under the existing sandbox's id).
//!
//! A spec that differs from the stored one is never reused silently: `up`
//! fails listing the differences, unless asked to recreate.

use serde::Serialize;
use serde_json::json;

use super::{Silo, SiloError, backend_error, machine};
use crate::backend::{Backend, MachineState};
use crate::naming::validate_name;
use crate::spec::SandboxSpec;
use crate::state::{EventKind, SandboxRecord, StateError};

/// What `silo up` asks for.
#[derive(Debug, Clone)]
pub struct UpRequest {
    /// The sandbox's name.
    pub name: String,
    /// The spec it must have; `None` opens whatever exists under the name
    /// (and cannot create one).
    pub spec: Option<SandboxSpec>,
    /// Replace the machine if the spec changed, instead of failing.
    pub recreate: bool,
}

/// What `silo up` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpAction {
    /// Tier 1: it was running; attached.
    Attached,
    /// Tier 1: it was stopped; started.
    Started,
    /// Tier 2: its machine was gone; made again from its latest snapshot.
    Restored,
    /// Tier 3: nothing existed; created.
    Created,
    /// Tier 3: its machine was replaced under the same id.
    Recreated,
    /// Tier 3: nothing existed; a started sandbox was taken from a warm
    /// pool and given the name.
    Claimed,
}

impl UpAction {
    /// The tier of open-or-create this action belongs to.
    pub fn tier(self) -> u8 {
        match self {
            UpAction::Attached | UpAction::Started => 1,
            UpAction::Restored => 2,
            UpAction::Created | UpAction::Recreated | UpAction::Claimed => 3,
        }
    }
}

/// The outcome of [`Silo::up`].
#[derive(Debug, Clone, Serialize)]
pub struct UpOutcome {
    /// The sandbox, as recorded now.
    pub sandbox: SandboxRecord,
    /// What was done.
    pub action: UpAction,
    /// Its tier.
    pub tier: u8,
    /// Why a tier was passed over (TTL expired, machine gone, spec changed).
    pub notes: Vec<String>,
}

impl Silo {
    /// Opens the sandbox `request.name`, or creates it. See the module docs.
    pub async fn up(&self, request: UpRequest) -> Result<UpOutcome, SiloError> {
        validate_name(&request.name)?;
        if let Some(spec) = &request.spec {
            spec.check()?;
        }
        let _lease = self.lease(&request.name, "up").await?;
        self.up_leased(request).await
    }

    /// [`Silo::up`] for a caller holding the name's lease, with the request
    /// checked.
    pub(super) async fn up_leased(&self, request: UpRequest) -> Result<UpOutcome, SiloError> {
        let found = self.db().sandbox(&request.name);
        let existing = match found {
            Ok(sandbox) => sandbox,
            Err(StateError::UnknownSandbox(_)) => {
                let spec = request.spec.ok_or_else(|| SiloError::NeedsSpec {
                    name: request.name.clone(),
                })?;
                let create = super::CreateRequest {
                    name: Some(request.name),
                    spec,
                };
                let sandbox = self.create_unleased(create).await?;
                return Ok(outcome(sandbox, UpAction::Created, Vec::new()));
            }
            Err(other) => return Err(other.into()),
        };
        // Another host's machine: where it is says more than how its spec
        // differs (nothing here could act on either).
        self.backend_of(&existing)?;

        let wanted = request.spec.unwrap_or_else(|| existing.spec.clone());
        let mut notes = Vec::new();
        if wanted.hash() != existing.spec_hash {
            let differences = wanted.differences_from(&existing.spec);
            if !request.recreate {
                return Err(SiloError::SpecDrift {
                    name: existing.name,
                    differences,
                });
            }
            notes.push(format!("spec changed ({})", differences.join("; ")));
            return self.recreate(existing, wanted, "spec changed", notes).await;
        }

        match self.status(&existing).await? {
            MachineState::Running => {
                let (existing, settled) = self.settle_rewind(existing).await?;
                notes.extend(settled);
                self.db().append_event(
                    &existing,
                    EventKind::Resumed,
                    &json!({ "tier": 1, "from": "running" }),
                )?;
                Ok(outcome(existing, UpAction::Attached, notes))
            }
            MachineState::Stopped => {
                if let Some(at_ms) = self.expired_at(&existing).await? {
                    notes.push(format!(
                        "its idle TTL expired ({} s ago); it counts as gone",
                        crate::state::now_ms().saturating_sub(at_ms) / 1000
                    ));
                    return self
                        .restore_or_recreate(existing, wanted, "idle ttl expired", notes)
                        .await;
                }
                let started = self.start_sandbox(&existing).await?;
                // Its agent finished at boot any layer it had begun.
                let (started, settled) = self.settle_rewind(started).await?;
                notes.extend(settled);
                self.db().append_event(
                    &started,
                    EventKind::Resumed,
                    &json!({ "tier": 1, "from": "stopped" }),
                )?;
                Ok(outcome(started, UpAction::Started, notes))
            }
            // A sandbox whose machine was never recorded as made: an earlier
            // create (or recreate) was cut short before the machine existed.
            MachineState::Missing if !existing.machine_recorded() => {
                notes.push(
                    "its machine was never made (an earlier create was interrupted); making it now"
                        .into(),
                );
                self.restore_or_recreate(existing, wanted, "machine never made", notes)
                    .await
            }
            MachineState::Missing => {
                notes.push(format!(
                    "its {} machine was removed outside silo",
                    existing.backend
                ));
                self.restore_or_recreate(existing, wanted, "machine missing", notes)
                    .await
            }
        }
    }

    /// When the sandbox's idle TTL expired, if it has one and it did: its
    /// machine stopped by itself, cleanly, and not because silo stopped it.
    pub async fn expired_at(&self, sandbox: &SandboxRecord) -> Result<Option<i64>, SiloError> {
        if sandbox.spec.idle_timeout_secs.is_none() {
            return Ok(None);
        }
        let key = self.sandbox_key(sandbox);
        let exit = self
            .backend_of(sandbox)?
            .last_exit(machine(sandbox, &key))
            .await
            .map_err(|e| backend_error("inspect", sandbox, e))?;
        let Some(exit) = exit.filter(|e| e.clean) else {
            return Ok(None);
        };
        let lifecycle = [
            EventKind::Created,
            EventKind::Started,
            EventKind::Stopped,
            EventKind::Resumed,
            EventKind::Recreated,
        ];
        let last = self.db().last_event_among(&sandbox.id, &lifecycle)?;
        if last.is_some_and(|(kind, _)| kind == EventKind::Stopped.as_str()) {
            return Ok(None);
        }
        Ok(Some(exit.at_ms))
    }

    /// Tier 2, else tier 3: the sandbox's machine is gone (or counts as
    /// gone), so it is made again from its latest snapshot if it has one,
    /// and fresh if not.
    async fn restore_or_recreate(
        &self,
        sandbox: SandboxRecord,
        spec: SandboxSpec,
        reason: &str,
        mut notes: Vec<String>,
    ) -> Result<UpOutcome, SiloError> {
        match self.restore_latest(&sandbox, reason).await? {
            Some(restored) => {
                notes.push(format!("restored from snapshot {}", restored.snapshot));
                self.db().append_event(
                    &restored.sandbox,
                    EventKind::Resumed,
                    &json!({ "tier": 2, "from": reason, "snapshot": restored.snapshot }),
                )?;
                Ok(outcome(restored.sandbox, UpAction::Restored, notes))
            }
            None => {
                if sandbox.machine_recorded() {
                    notes.push(
                        "it has no snapshot to restore from, so the files it had are gone: \
                         this is a fresh machine"
                            .into(),
                    );
                }
                self.recreate(sandbox, spec, reason, notes).await
            }
        }
    }

    /// Tier 3 for an existing sandbox: removes its machine (if any) and makes
    /// a fresh one with `spec` under the same id, name and history.
    pub(super) async fn recreate(
        &self,
        sandbox: SandboxRecord,
        spec: SandboxSpec,
        reason: &str,
        notes: Vec<String>,
    ) -> Result<UpOutcome, SiloError> {
        let key = self.sandbox_key(&sandbox);
        self.backend_of(&sandbox)?
            .remove(machine(&sandbox, &key))
            .await
            .map_err(|e| backend_error("remove", &sandbox, e))?;
        let detail = json!({
            "reason": reason,
            "old_spec_hash": sandbox.spec_hash,
            "spec_hash": spec.hash(),
        });
        let sandbox =
            self.db()
                .replace_machine(&sandbox, &spec, None, (EventKind::Recreated, detail))?;
        let made = self.machine_to_make(&sandbox, &key);
        let made = self.backend_of(&sandbox)?.create(made).await;
        let sandbox = self.record_made(&sandbox, made).await?;
        Ok(outcome(sandbox, UpAction::Recreated, notes))
    }
}

pub(super) fn outcome(sandbox: SandboxRecord, action: UpAction, notes: Vec<String>) -> UpOutcome {
    UpOutcome {
        sandbox,
        action,
        tier: action.tier(),
        notes,
    }
}
