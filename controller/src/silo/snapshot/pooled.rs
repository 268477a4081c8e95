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
//!
//! A fresh member is taken only when that is expected to be faster than a
//! new machine. Its claim applies everything the snapshot has above its
//! base, so it costs what those layers weigh, while a new machine costs
//! about the same whatever the snapshot holds ([`PoolCost`], measured in
//! `docs/benchmarks.md`); a snapshot heavier than the break-even goes onto
//! a new machine, and the report says so with both estimates. A pool
//! standing on the snapshot applies next to nothing and is always taken.

use std::time::Instant;

use super::in_place::NotInPlace;
use super::{RestoreReport, blocking, ms_since, parse_digest};
use crate::backend::SnapshotWay;
use crate::silo::{Silo, SiloError};
use crate::spec::SandboxSpec;
use crate::state::{SandboxRecord, Snapshot};

/// What a fork is expected to cost onto a fresh pool member and onto a
/// new machine, from one engine's measurements: a claim's apply takes
/// about 115 ms and 120 ms more per MB of layers above the base (entries
/// staged, placed and their times set), a new container of an image the
/// engine has about 700 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PoolCost {
    /// Bytes of the snapshot's layers above its base.
    pub apply_bytes: u64,
}

impl PoolCost {
    const APPLY_FIXED_MS: u64 = 115;
    const APPLY_MS_PER_MB: u64 = 120;
    const NEW_MACHINE_MS: u64 = 700;

    /// Expected milliseconds of a claim's apply.
    pub fn apply_ms(self) -> u64 {
        Self::APPLY_FIXED_MS + self.apply_bytes.saturating_mul(Self::APPLY_MS_PER_MB) / 1_000_000
    }

    /// Why a new machine is expected faster, or `None` when the claim is.
    pub fn new_machine_faster(self) -> Option<String> {
        let apply = self.apply_ms();
        (apply > Self::NEW_MACHINE_MS).then(|| {
            format!(
                "a fresh pool member would apply {:.1} MB above the snapshot's base (about \
                 {apply} ms), a new machine is expected sooner (about {} ms)",
                self.apply_bytes as f64 / 1e6,
                Self::NEW_MACHINE_MS
            )
        })
    }
}

impl Silo {
    /// What a claim of a fresh member would apply for `snapshot`; `None`
    /// when the store cannot tell (a blob it cannot stat), and the member
    /// is then taken as before.
    async fn pool_cost(&self, snapshot: &Snapshot) -> Option<PoolCost> {
        let base_layers = self.base_of(snapshot).ok()?.layers.len();
        let store = self.store().ok()?;
        let above: Vec<_> = snapshot
            .layers
            .iter()
            .skip(base_layers)
            .map(|layer| parse_digest(layer))
            .collect::<Result<_, _>>()
            .ok()?;
        let bytes = blocking(move || {
            let sizes = above.iter().map(|digest| store.size(digest));
            Ok(sizes.collect::<Result<Vec<u64>, _>>()?.iter().sum())
        })
        .await
        .ok()?;
        Some(PoolCost { apply_bytes: bytes })
    }

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
        // Only asked when a fresh member could be taken.
        let mut too_heavy: Option<Option<String>> = None;
        for pool in pools {
            // Bound first: the database guard must not live through the loop.
            let members = self.members_here(&pool.name)?;
            let on_snapshot = pool.snapshot.is_some();
            if !on_snapshot && !members.is_empty() {
                if too_heavy.is_none() {
                    let cost = self.pool_cost(snapshot).await;
                    too_heavy = Some(cost.and_then(PoolCost::new_machine_faster));
                }
                if let Some(Some(slower)) = &too_heavy {
                    why = Some(format!("pool {}: {slower}", pool.name));
                    continue;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_member_is_taken_only_below_the_break_even() {
        let light = PoolCost {
            apply_bytes: 700_000,
        };
        assert!(light.apply_ms() < 300 && light.new_machine_faster().is_none());
        let heavy = PoolCost {
            apply_bytes: 9_400_000,
        };
        let why = heavy.new_machine_faster().expect("a new machine is faster");
        assert!(why.contains("9.4 MB") && why.contains("700 ms"), "{why}");
    }
}
