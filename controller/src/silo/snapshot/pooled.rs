//! A fork onto a warm pool member: instead of a new machine, `silo fork`
//! takes a started sandbox from a pool whose machines stand on the
//! snapshot's base and rewinds it in place to the snapshot (`in_place`:
//! the member's anchor is the image or template it was made from, the
//! target is the snapshot), so a fork costs a claim and an apply instead
//! of a machine start.
//!
//! A member fits when:
//! - its pool's spec is the fork's (backend, image or template, env,
//!   mounts, network, limits, workload), so the fork is the sandbox a new
//!   machine would have made;
//! - it is fresh: still in its pool (a claim takes a member out for good),
//!   never snapshotted nor rewound (no checkpoint, no origin), so nothing
//!   of another sandbox's can be on it;
//! - its machine stands on the snapshot's base: the same image id for a
//!   container, the same template listing (same base id) for a VM.
//!
//! The member keeps the id, and so the key, it was made with, which no
//! other sandbox ever had. The rewind ends every process on it and makes
//! its files the snapshot's, entry by entry, as any rewind in place does.
//! When no member fits, or the apply fails (the member is then removed:
//! its files may be half way), the fork makes a new machine and its report
//! says why. Refilling the pool is the caller's, as after `up --pool`.
//!
//! A pool standing on the fork's snapshot comes first: its members were
//! rewound to the snapshot when the pool was filled (their checkpoint is
//! the snapshot), so the claim's rewind in place starts from the snapshot
//! and only restores what changed on the member since, usually nothing.
//! A pool standing on another snapshot is never used.

use std::time::Instant;

use super::in_place::NotInPlace;
use super::{RestoreReport, ms_since};
use crate::backend::SnapshotWay;
use crate::silo::{Silo, SiloError};
use crate::spec::SandboxSpec;
use crate::state::{SandboxRecord, Snapshot};

impl Silo {
    /// Makes the fork `name` of `snapshot` from a fitting pool member (see
    /// the module docs); `Ok(Err(why))` when none could be used. Call with
    /// the lease of `name` held.
    pub(super) async fn fork_onto_pool(
        &self,
        strategy: &SnapshotWay,
        snapshot: &Snapshot,
        spec: &SandboxSpec,
        name: &str,
    ) -> Result<Result<RestoreReport, String>, SiloError> {
        let start = Instant::now();
        let mut pools: Vec<_> = self
            .db()
            .pools()?
            .into_iter()
            .filter(|pool| pool.spec == *spec)
            .filter(|pool| pool.snapshot.as_ref().is_none_or(|on| *on == snapshot.id))
            .collect();
        // Those standing on the snapshot first.
        pools.sort_by_key(|pool| pool.snapshot.is_none());
        if pools.is_empty() {
            return Ok(Err("no pool keeps sandboxes of the snapshot's spec".into()));
        }
        let mut why = None;
        for pool in pools {
            // Bound first: the database guard must not live through the loop.
            let members = self.members_here(&pool.name)?;
            let on_snapshot = pool.snapshot.is_some();
            for member in members {
                if let Err(unfit) = self.fits(strategy, &member, snapshot, on_snapshot).await {
                    why = Some(format!("pool {}: {unfit}", pool.name));
                    continue;
                }
                let Some(claimed) = self.db().claim_member(&pool.name, &member, name)? else {
                    continue; // another fork or `up --pool` took it
                };
                // A member standing on the snapshot is rewound from there
                // (its origin is the snapshot already); a fresh one from
                // its image, as a fork.
                let from_image = !on_snapshot;
                return match self.rewind_in_place(&claimed, snapshot, from_image).await? {
                    Ok(report) => Ok(Ok(RestoreReport {
                        ms: ms_since(start),
                        pool: Some(pool.name.clone()),
                        ..report
                    })),
                    Err(NotInPlace(failed)) => {
                        self.remove_member(&claimed).await?;
                        Ok(Err(format!(
                            "sandbox {} of pool {} could not take the snapshot in place \
                             ({failed}) and was removed",
                            claimed.id, pool.name
                        )))
                    }
                };
            }
        }
        Ok(Err(why.unwrap_or_else(|| {
            "no pool of the snapshot's spec has a sandbox ready".into()
        })))
    }

    /// Whether `member` may become a fork of `snapshot`, or why not. A
    /// member of a pool standing `on_snapshot` must stand on it; any other
    /// must be fresh.
    async fn fits(
        &self,
        strategy: &SnapshotWay,
        member: &SandboxRecord,
        snapshot: &Snapshot,
        on_snapshot: bool,
    ) -> Result<(), String> {
        if !member.machine_recorded() {
            return Err(format!("sandbox {} has no machine yet", member.id));
        }
        if on_snapshot {
            let stands_on = member.checkpoint.as_ref().map(|c| c.snapshot.as_str());
            if stands_on != Some(snapshot.id.as_str()) {
                return Err(format!(
                    "sandbox {} was not brought to snapshot {} yet",
                    member.id, snapshot.id
                ));
            }
        } else if member.checkpoint.is_some() || member.origin_snapshot.is_some() {
            return Err(format!(
                "sandbox {} is not fresh (it was snapshotted or rewound)",
                member.id
            ));
        }
        let started = strategy
            .machine_start(self, member)
            .await
            .map_err(|NotInPlace(why)| why)?;
        if started.image_id != snapshot.base_image {
            return Err(format!(
                "its sandboxes stand on {}, the snapshot on {}",
                started.image_id, snapshot.base_image
            ));
        }
        Ok(())
    }
}
