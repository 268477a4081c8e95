//! Warm pools (`silo pool`, `silo up --pool`): started sandboxes of one
//! spec, kept ready so that opening a new sandbox costs a rename instead of
//! a machine start.
//!
//! No daemon keeps a pool full. [`Silo::fill_pool`] makes what is missing
//! and returns; whoever notices a deficit calls it (the CLI starts a
//! detached `silo pool fill` after each claim). Fills of one pool take
//! turns under the pool's lease, each counting what is missing once it
//! holds it, so two fills never overfill and none misses a claim. A member is claimed once (see `state::pools`): the claimed
//! sandbox keeps the id, and so the key, it was made with, and no other
//! sandbox ever ran on its machine.
//!
//! A pool may stand on a snapshot ([`Silo::create_pool_on_snapshot`]): each
//! member is made from the snapshot's spec and rewound in place to it when
//! the pool is filled, so a fork of that snapshot claims a member whose
//! files are the snapshot's already and only checks them (a rewind in place
//! that finds nothing changed), however many files the snapshot holds.

use futures_util::stream::{self, StreamExt};
use serde::Serialize;

use super::open::outcome;
use super::snapshot::NotInPlace;
use super::{Silo, SiloError, SnapshotError, backend_error, machine};
use crate::backend::{Backend, MachineState};
use crate::naming::{new_sandbox_id, validate_name};
use crate::spec::SandboxSpec;
use crate::state::{NewSandbox, Pool, SandboxRecord, StateError, now_ms};
use crate::{UpAction, UpOutcome, UpRequest};

/// Most members a pool may keep.
pub const MAX_POOL_SIZE: u32 = 256;
/// Members made at once by a fill.
const FILL_CONCURRENCY: usize = 4;

/// A pool and how many of its members are ready.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStatus {
    /// The pool.
    #[serde(flatten)]
    pub pool: Pool,
    /// Members whose machine was made.
    pub ready: usize,
    /// Their ids, oldest first.
    pub members: Vec<String>,
}

/// What a fill did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FillReport {
    /// Members made.
    pub made: usize,
    /// Why members could not be made (one line each).
    pub failed: Vec<String>,
}

/// Why a pool request was refused before anything changed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The size is out of range.
    #[error("a pool keeps 1 to {MAX_POOL_SIZE} sandboxes ready, not {0}")]
    Size(u32),
}

impl Silo {
    /// Records a pool of `size` sandboxes of `spec` (not filled yet: see
    /// [`Silo::fill_pool`]).
    pub fn create_pool(&self, name: &str, spec: SandboxSpec, size: u32) -> Result<Pool, SiloError> {
        self.record_pool(name, spec, size, None)
    }

    /// Records a pool of `size` forks of `snapshot` (not filled yet): its
    /// members have the snapshot's spec and stand on the snapshot once
    /// filled, so a fork of it ([`Silo::fork`], [`Silo::fork_many`]) is a
    /// claim and a check.
    pub fn create_pool_on_snapshot(
        &self,
        name: &str,
        snapshot: &str,
        size: u32,
    ) -> Result<Pool, SiloError> {
        let snapshot = self.db().snapshot(snapshot)?;
        if self.strategy(snapshot.spec.backend).is_none() {
            return Err(SnapshotError::Unsupported {
                name: snapshot.sandbox_name.clone(),
                backend: snapshot.spec.backend,
            }
            .into());
        }
        self.record_pool(name, snapshot.spec.clone(), size, Some(snapshot.id))
    }

    fn record_pool(
        &self,
        name: &str,
        spec: SandboxSpec,
        size: u32,
        snapshot: Option<String>,
    ) -> Result<Pool, SiloError> {
        validate_name(name)?;
        spec.check()?;
        if size == 0 || size > MAX_POOL_SIZE {
            return Err(SiloError::Pool(PoolError::Size(size)));
        }
        let pool = Pool {
            name: name.to_owned(),
            spec,
            size,
            created_at_ms: now_ms(),
            snapshot,
        };
        self.db().insert_pool(&pool)?;
        Ok(pool)
    }

    /// Every pool with its ready count.
    pub fn pools(&self) -> Result<Vec<PoolStatus>, SiloError> {
        let pools = self.db().pools()?;
        pools
            .into_iter()
            .map(|pool| {
                let members: Vec<String> = self
                    .db()
                    .pool_members(&pool.name)?
                    .into_iter()
                    .filter(SandboxRecord::machine_recorded)
                    .map(|m| m.id)
                    .collect();
                Ok(PoolStatus {
                    pool,
                    ready: members.len(),
                    members,
                })
            })
            .collect()
    }

    /// Makes the members `name` lacks, a few at a time. Members whose
    /// machine is gone (or was never made) are removed first.
    pub async fn fill_pool(&self, name: &str) -> Result<FillReport, SiloError> {
        // Counted and filled under the pool's lease, so two fills never
        // overfill, and a fill that waited sees what the other one made.
        let _lease = self.lease(&pool_lease(name), "fill").await?;
        let pool = self.db().pool(name)?;
        let mut ready = 0usize;
        let members = self.members_here(name)?;
        for member in members {
            let alive = member.machine_recorded()
                && matches!(self.status(&member).await, Ok(MachineState::Running));
            if alive {
                ready += 1;
            } else {
                self.remove_member(&member).await?;
            }
        }
        let missing = usize::try_from(pool.size)
            .unwrap_or(usize::MAX)
            .saturating_sub(ready);
        let results: Vec<Result<SandboxRecord, SiloError>> = stream::iter(0..missing)
            .map(|_| self.make_member(&pool))
            .buffer_unordered(FILL_CONCURRENCY)
            .collect()
            .await;
        let mut report = FillReport::default();
        for result in results {
            match result {
                Ok(_) => report.made += 1,
                Err(error) => report.failed.push(silo_protocol::http::error_chain(&error)),
            }
        }
        Ok(report)
    }

    /// The members of `pool` this host may operate, its own first: on a
    /// backend whose machines live on one host, each host of a fleet keeps
    /// and claims members of its own; a provider's members are shared, and
    /// a host takes those it made before others'. Claims stay single across
    /// hosts because a claim is one conditional update of the member's row.
    pub(crate) fn members_here(&self, pool: &str) -> Result<Vec<SandboxRecord>, SiloError> {
        // Bound first: the database guard must not outlive this call.
        let mut members = self.db().pool_members(pool)?;
        let fleet = self.fleet();
        members.retain(|member| fleet.may_operate(member));
        members.sort_by_key(|member| member.host.as_deref() != Some(fleet.host.as_str()));
        Ok(members)
    }

    /// Removes a pool with its members' machines; answers how many members
    /// it had. Refused while a member lives on another host of the fleet,
    /// which alone can remove it.
    pub async fn remove_pool(&self, name: &str) -> Result<usize, SiloError> {
        let _lease = self.lease(&pool_lease(name), "remove").await?;
        self.db().pool(name)?;
        let members = self.db().pool_members(name)?;
        if let Some(elsewhere) = members.iter().find(|m| !self.fleet().may_operate(m)) {
            return Err(SiloError::OtherHost {
                name: elsewhere.name.clone(),
                host: elsewhere.host.clone().unwrap_or_default(),
                backend: elsewhere.backend,
            });
        }
        for member in &members {
            self.remove_member(member).await?;
        }
        self.db().delete_pool(name)?;
        Ok(members.len())
    }

    /// Opens the sandbox `name` as [`Silo::up`] does, creating it by taking
    /// a started sandbox from `pool` when it does not exist. An empty pool
    /// makes a fresh one of the pool's spec. The caller refills the pool
    /// ([`Silo::fill_pool`]).
    pub async fn up_from_pool(&self, name: &str, pool: &str) -> Result<UpOutcome, SiloError> {
        validate_name(name)?;
        let _lease = self.lease(name, "up").await?;
        let reuse = UpRequest {
            name: name.to_owned(),
            spec: None,
            recreate: false,
        };
        let found = self.db().sandbox(name);
        match found {
            Ok(_) => return self.up_leased(reuse).await,
            Err(StateError::UnknownSandbox(_)) => {}
            Err(other) => return Err(other.into()),
        }
        let spec = self.db().pool(pool)?.spec;
        let members = self.members_here(pool)?;
        for member in members {
            if !member.machine_recorded() {
                continue;
            }
            let Some(claimed) = self.db().claim_member(pool, &member, name)? else {
                continue; // another process took it
            };
            if self.status(&claimed).await? == MachineState::Running {
                return Ok(outcome(claimed, UpAction::Claimed, Vec::new()));
            }
            // Its machine stopped or went while it waited: open it the
            // usual way, which starts or remakes it.
            let mut opened = self.up_leased(reuse).await?;
            opened.notes.push(format!(
                "taken from pool {pool}, whose machine was not running"
            ));
            return Ok(opened);
        }
        let mut created = self
            .up_leased(UpRequest {
                spec: Some(spec),
                ..reuse
            })
            .await?;
        created.notes.push(format!(
            "pool {pool} had no sandbox ready; made a fresh one"
        ));
        Ok(created)
    }

    /// Makes one member of `pool`, named by its id. Nothing is left behind
    /// on failure.
    async fn make_member(&self, pool: &Pool) -> Result<SandboxRecord, SiloError> {
        let id = new_sandbox_id()?;
        let new = NewSandbox {
            name: id.clone(),
            id,
            spec: pool.spec.clone(),
            origin_snapshot: None,
            host: self.fleet().host.clone(),
        };
        let member = self.db().insert_pool_member(&pool.name, &new)?;
        let member = self.launch(member, None).await?;
        let Some(on) = &pool.snapshot else {
            return Ok(member);
        };
        let snapshot = self.db().snapshot(on)?;
        match self.fill_in_place(&member, &snapshot).await? {
            Ok(report) => Ok(report.sandbox),
            Err(NotInPlace(why)) => {
                self.remove_member(&member).await?;
                Err(SnapshotError::PoolMember {
                    pool: pool.name.clone(),
                    snapshot: snapshot.id,
                    why,
                }
                .into())
            }
        }
    }

    /// Removes a member's machine (if any) and its row.
    pub(in crate::silo) async fn remove_member(
        &self,
        member: &SandboxRecord,
    ) -> Result<(), SiloError> {
        let key = self.sandbox_key(member);
        self.backend(member.backend)
            .remove(machine(member, &key))
            .await
            .map_err(|e| backend_error("remove", member, e))?;
        let detail = serde_json::json!({ "reason": "pool member removed" });
        self.db().delete_sandbox(member, &detail)?;
        Ok(())
    }
}

/// The lease a pool's fills and removal take: no sandbox name has a `:`.
fn pool_lease(name: &str) -> String {
    format!("pool:{name}")
}
