//! Taking and holding a sandbox's lease around a lifecycle operation, so
//! two `silo` processes never create, start, stop or remove one sandbox at
//! the same time. The rows and the owner checks are in
//! [`crate::state`]; this is the waiting, and the guard that releases.
//!
//! A lease is dropped (released) when the operation's future ends, however
//! it ends. A process that dies holding one leaves a row naming a dead
//! owner, which the next process reclaims at once.

use std::time::Duration;

use super::{Silo, SiloError};
use crate::retry::Deadline;
use crate::state::{LeaseAttempt, LeaseHolder, LeaseOwner, SandboxRecord};

/// How long an operation waits for another process's operation on the same
/// sandbox (long enough for a slow create, which may pull an image).
pub const LEASE_WAIT: Duration = Duration::from_secs(300);
/// Pause between attempts while another process holds the lease.
const LEASE_POLL: Duration = Duration::from_millis(20);
/// Random bytes in a lease token.
const TOKEN_BYTES: usize = 8;

/// A held lease; released when dropped.
#[derive(Debug)]
pub struct Lease<'a> {
    silo: &'a Silo,
    name: String,
    owner: LeaseOwner,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.silo.db().release_lease(&self.name, &self.owner) {
            // The row names this process; once it exits the lease is reclaimed.
            tracing::warn!(sandbox = self.name, "releasing a lease failed: {error}");
        }
    }
}

impl Silo {
    /// Takes the lease on sandbox name `name` for `op`, waiting up to
    /// [`LEASE_WAIT`] for another process to finish. Every lifecycle
    /// operation takes it; a caller may hold it around several operations
    /// (they must then be ones that take no lease of their own, or they
    /// would wait on it), or to keep other processes out for a while.
    #[doc(hidden)]
    pub async fn lease(&self, name: &str, op: &'static str) -> Result<Lease<'_>, SiloError> {
        self.lease_within(name, op, LEASE_WAIT)
            .await?
            .map_err(|holder| SiloError::Busy {
                name: name.to_owned(),
                waited: LEASE_WAIT,
                holder: holder_text(&holder),
            })
    }

    /// Takes the lease if it is free now (or its owner is dead); `None` if a
    /// live process holds it.
    pub(crate) async fn try_lease(
        &self,
        name: &str,
        op: &'static str,
    ) -> Result<Option<Lease<'_>>, SiloError> {
        Ok(self.lease_within(name, op, Duration::ZERO).await?.ok())
    }

    /// Looks a sandbox up, takes its lease, and reads it again under the
    /// lease (another process may have changed or removed it meanwhile).
    pub(crate) async fn lease_sandbox(
        &self,
        name_or_id: &str,
        op: &'static str,
    ) -> Result<(Lease<'_>, SandboxRecord), SiloError> {
        let name = self.get(name_or_id)?.name;
        let lease = self.lease(&name, op).await?;
        // A rewind its last holder left under way is settled first.
        let (sandbox, settled) = self.settle_rewind(self.get(&name)?).await?;
        if let Some(note) = settled {
            tracing::info!(sandbox = name, "{note}");
        }
        Ok((lease, sandbox))
    }

    /// The lease, or (after `wait`) whoever still holds it.
    async fn lease_within(
        &self,
        name: &str,
        op: &'static str,
        wait: Duration,
    ) -> Result<Result<Lease<'_>, LeaseHolder>, SiloError> {
        let mut token = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut token).map_err(|_| crate::naming::NamingError::NoRandomness)?;
        let owner = LeaseOwner::current(hex::encode(token), &self.fleet().host)
            .ok_or(SiloError::NoProcessIdentity)?;
        let deadline = Deadline::after(wait, LEASE_POLL);
        let mut announced = false;
        loop {
            let attempt = self.db().try_acquire_lease(name, op, &owner)?;
            match attempt {
                LeaseAttempt::Acquired { reclaimed } => {
                    if let Some(dead) = reclaimed {
                        tracing::warn!(
                            sandbox = name,
                            "took over the lease of silo process {} (`{}`), which is gone",
                            dead.pid,
                            dead.op
                        );
                    }
                    return Ok(Ok(Lease {
                        silo: self,
                        name: name.to_owned(),
                        owner,
                    }));
                }
                LeaseAttempt::Held(holder) => {
                    if deadline.passed() {
                        return Ok(Err(holder));
                    }
                    if !announced {
                        announced = true;
                        tracing::warn!(
                            sandbox = name,
                            "waiting for silo process {} on host {} to finish `{}`",
                            holder.pid,
                            holder.host,
                            holder.op
                        );
                    }
                    deadline.pause().await;
                }
            }
        }
    }
}

/// Who holds a lease, in words, for the busy error.
fn holder_text(holder: &LeaseHolder) -> String {
    let age = crate::state::now_ms().saturating_sub(holder.since_ms) / 1000;
    format!(
        "silo process {} on host {} (`{}`, for {age} s)",
        holder.pid, holder.host, holder.op
    )
}
