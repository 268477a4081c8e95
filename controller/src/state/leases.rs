//! Leases: at most one `silo` process at a time runs a lifecycle operation
//! (create, up, start, stop, rm, gc) on a given sandbox name.
//!
//! A lease is a row naming its owner. Taking one is a single write
//! transaction: free, held by a dead owner (reclaimed), or held by a live one
//! (refused, and the caller decides whether to wait). An owner is a process
//! identity, host plus pid plus start time plus boot id, so a crashed `silo`
//! never wedges a sandbox: its pid is gone, or belongs to another process
//! now. A process on another host of a fleet cannot be looked at from
//! here, so its lease counts as live until [`FOREIGN_LEASE_MS`] after it
//! was taken (a lifecycle operation is over long before; a host that died
//! holding one delays that sandbox by at most this long).
//! Releasing deletes only the caller's own row (by token), so a lease that was
//! reclaimed from a slow owner is never released by that owner.

use std::fs;

use super::sql::{Sql, args};
use super::{StateDb, StateError, db, now_ms};

/// How long a lease taken on another host of the fleet counts as held.
pub const FOREIGN_LEASE_MS: i64 = 15 * 60 * 1000;

/// Who holds (or asks for) a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner {
    /// The host it runs on (`SILO_HOST`).
    pub host: String,
    /// The owning process.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start: u64,
    /// The boot it started in.
    pub boot: String,
    /// Distinguishes this lease from others taken by the same process.
    pub token: String,
}

/// A lease someone else holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The host of the holding process.
    pub host: String,
    /// The holding process.
    pub pid: u32,
    /// What it is doing.
    pub op: String,
    /// Since when (unix ms).
    pub since_ms: i64,
}

/// The outcome of one attempt to take a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAttempt {
    /// Ours now; `reclaimed` names a dead owner it was taken from.
    Acquired {
        /// The dead owner whose lease this replaced, if any.
        reclaimed: Option<LeaseHolder>,
    },
    /// A live process holds it.
    Held(LeaseHolder),
}

impl LeaseOwner {
    /// This process on `host`, with a fresh token.
    pub fn current(token: String, host: &str) -> Option<Self> {
        let pid = std::process::id();
        Some(Self {
            host: host.to_owned(),
            pid,
            start: process_start(pid)?,
            boot: boot_id()?,
            token,
        })
    }

    /// Whether the process this owner names is still running (looked at
    /// on this machine, so for an owner on this host).
    pub fn is_alive(&self) -> bool {
        boot_id().is_some_and(|boot| boot == self.boot)
            && process_start(self.pid).is_some_and(|start| start == self.start)
    }

    /// Whether this owner's lease, taken at `since_ms`, still holds, as
    /// the host `here` can tell: its process runs, for an owner on this
    /// host; it is recent, for one on another.
    fn holds(&self, since_ms: i64, here: &str) -> bool {
        if self.host.is_empty() || self.host == here {
            self.is_alive()
        } else {
            now_ms().saturating_sub(since_ms) < FOREIGN_LEASE_MS
        }
    }
}

impl StateDb {
    /// The live process holding the lease on `name`, as the host `here`
    /// can tell, if any.
    pub fn lease_holder(&self, name: &str, here: &str) -> Result<Option<LeaseHolder>, StateError> {
        let held = read_lease(self.sql(), name)?;
        Ok(held
            .filter(|(owner, holder)| owner.holds(holder.since_ms, here))
            .map(|(_, holder)| holder))
    }

    /// Takes the lease on `name` for `op` unless a live process holds it.
    pub fn try_acquire_lease(
        &mut self,
        name: &str,
        op: &str,
        me: &LeaseOwner,
    ) -> Result<LeaseAttempt, StateError> {
        let now = now_ms();
        self.write("taking a lease", |tx| {
            let held = read_lease(tx, name)?;
            let reclaimed = match held {
                Some((owner, holder)) if owner.holds(holder.since_ms, &me.host) => {
                    return Ok(LeaseAttempt::Held(holder));
                }
                Some((_, holder)) => Some(holder),
                None => None,
            };
            tx.execute(
                "INSERT INTO leases (name, owner_pid, owner_start, owner_boot, owner_token, op, \
                 acquired_at, owner_host) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                 ON CONFLICT (name) DO UPDATE SET owner_pid = excluded.owner_pid, \
                 owner_start = excluded.owner_start, owner_boot = excluded.owner_boot, \
                 owner_token = excluded.owner_token, op = excluded.op, \
                 acquired_at = excluded.acquired_at, owner_host = excluded.owner_host",
                args![name, me.pid, me.start, me.boot, me.token, op, now, me.host],
            )
            .map_err(db("taking a lease"))?;
            Ok(LeaseAttempt::Acquired { reclaimed })
        })
    }

    /// Gives up a lease, if it is still ours.
    pub fn release_lease(&mut self, name: &str, me: &LeaseOwner) -> Result<(), StateError> {
        self.write("releasing a lease", |tx| {
            tx.execute(
                "DELETE FROM leases WHERE name = ?1 AND owner_token = ?2",
                args![name, me.token],
            )
            .map_err(db("releasing a lease"))?;
            Ok(())
        })
    }
}

/// A process's start time in clock ticks after boot; `None` once it is gone
/// or a zombie (it will never release anything).
/// The row of the lease on `name`: who owns it, and as whom it shows.
fn read_lease(sql: &dyn Sql, name: &str) -> Result<Option<(LeaseOwner, LeaseHolder)>, StateError> {
    let what = "reading a lease";
    let Some(row) = sql
        .query_opt(
            "SELECT owner_pid, owner_start, owner_boot, owner_token, op, acquired_at, \
             owner_host FROM leases WHERE name = ?1",
            args![name],
        )
        .map_err(db(what))?
    else {
        return Ok(None);
    };
    let pid: u32 = row.get(0).map_err(db(what))?;
    // A lease taken before hosts were recorded is this home's own.
    let host: String = row
        .get::<Option<String>>(6)
        .map_err(db(what))?
        .unwrap_or_default();
    Ok(Some((
        LeaseOwner {
            host: host.clone(),
            pid,
            start: row.get::<i64>(1).map_err(db(what))?.try_into().unwrap_or(0),
            boot: row.get(2).map_err(db(what))?,
            token: row.get(3).map_err(db(what))?,
        },
        LeaseHolder {
            host,
            pid,
            op: row.get(4).map_err(db(what))?,
            since_ms: row.get(5).map_err(db(what))?,
        },
    )))
}

fn process_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields are
    // counted from the last ')'. There, field 3 (state) is first and field
    // 22 (starttime) is the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_support::temp_dbs;

    fn me(token: &str) -> LeaseOwner {
        LeaseOwner::current(token.into(), "here").unwrap()
    }

    #[test]
    fn a_live_holder_keeps_its_lease_until_it_releases() {
        for (_scratch, mut db) in temp_dbs() {
            let (a, b) = (me("a"), me("b"));
            assert_eq!(
                db.try_acquire_lease("x", "up", &a).unwrap(),
                LeaseAttempt::Acquired { reclaimed: None }
            );
            let LeaseAttempt::Held(holder) = db.try_acquire_lease("x", "rm", &b).unwrap() else {
                panic!("a live lease was taken over");
            };
            assert_eq!((holder.pid, holder.op.as_str()), (std::process::id(), "up"));
            // Another name is independent.
            assert!(matches!(
                db.try_acquire_lease("y", "rm", &b).unwrap(),
                LeaseAttempt::Acquired { .. }
            ));
            // Releasing someone else's lease does nothing.
            db.release_lease("x", &b).unwrap();
            assert!(matches!(
                db.try_acquire_lease("x", "rm", &b).unwrap(),
                LeaseAttempt::Held(_)
            ));
            db.release_lease("x", &a).unwrap();
            assert!(matches!(
                db.try_acquire_lease("x", "rm", &b).unwrap(),
                LeaseAttempt::Acquired { reclaimed: None }
            ));
        }
    }

    #[test]
    fn a_dead_owners_lease_is_reclaimed() {
        for (_scratch, mut db) in temp_dbs() {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id();
            let start = process_start(pid);
            child.wait().unwrap();
            let dead = LeaseOwner {
                pid,
                start: start.unwrap_or(1),
                ..me("dead")
            };
            assert!(!dead.is_alive());
            db.try_acquire_lease("x", "up", &dead).unwrap();
            let LeaseAttempt::Acquired { reclaimed } =
                db.try_acquire_lease("x", "rm", &me("b")).unwrap()
            else {
                panic!("a dead owner's lease was not reclaimed");
            };
            assert_eq!(reclaimed.map(|h| h.pid), Some(pid));
            // Same pid, other start time: a recycled pid is not the owner.
            let recycled = LeaseOwner {
                start: me("c").start + 1,
                ..me("c")
            };
            assert!(!recycled.is_alive());
        }
    }

    #[test]
    fn a_lease_from_another_host_holds_until_it_is_old() {
        for (_scratch, mut db) in temp_dbs() {
            // The other host's process cannot be looked at from here: its
            // pid and boot mean nothing on this machine.
            let there = LeaseOwner {
                host: "there".into(),
                pid: u32::MAX,
                ..me("there")
            };
            db.try_acquire_lease("x", "up", &there).unwrap();
            let LeaseAttempt::Held(holder) = db.try_acquire_lease("x", "rm", &me("b")).unwrap()
            else {
                panic!("a fresh lease of another host was taken over");
            };
            assert_eq!(holder.host, "there");
            assert!(db.lease_holder("x", "here").unwrap().is_some());
            // Old enough, it is taken back.
            db.sql()
                .execute(
                    "UPDATE leases SET acquired_at = ?1 WHERE name = 'x'",
                    args![now_ms() - FOREIGN_LEASE_MS - 1],
                )
                .unwrap();
            assert!(db.lease_holder("x", "here").unwrap().is_none());
            assert!(matches!(
                db.try_acquire_lease("x", "rm", &me("b")).unwrap(),
                LeaseAttempt::Acquired { reclaimed: Some(_) }
            ));
        }
    }
}
