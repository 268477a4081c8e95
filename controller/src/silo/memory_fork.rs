//! `Silo::fork_with_memory`: a new sandbox from a running one captured
//! whole by its provider (E2B's snapshot with memory), for a fork that
//! keeps what the processes hold as well as the files. It works only
//! within one provider that can capture memory; silo's own snapshots
//! ([`Silo::fork`]) copy files and stay the way across backends.
//!
//! The new sandbox has its own id and so its own key: whatever agent the
//! capture brings along answers only the original's key, so the backend
//! ends it and starts this sandbox's own.
//!
//! The capture lives as long as the fork: the provider keeps the machine's
//! state there (E2B refuses to delete a snapshot's template while a sandbox
//! made from it lives), so it is deleted when the fork is removed
//! (`silo rm`, or gc's removal), never by the fork itself. A capture no
//! machine was made from (the create from it failed) is deleted at once,
//! so a failed fork leaves nothing at the provider.

use super::{CreateRequest, Silo, SiloError, backend_error, machine};
use crate::backend::{Backend, NoMemoryFork};
use crate::naming::validate_name;
use crate::state::SandboxRecord;

/// The prefix of a memory capture's name at the provider, before the new
/// sandbox's id, so a capture names the sandbox it was made for.
const CAPTURE_PREFIX: &str = "silo-fork-";

impl Silo {
    /// Makes `name`, a new sandbox on the same backend and spec as the
    /// running sandbox `source`, from the provider's capture of it with its
    /// memory; refused with [`NoMemoryFork`] where the backend cannot
    /// capture memory. The source runs on untouched.
    pub async fn fork_with_memory(
        &self,
        source: &str,
        name: &str,
    ) -> Result<SandboxRecord, SiloError> {
        validate_name(name)?;
        let source = self.get(source)?;
        let backend = self.backend(source.backend);
        if !backend.forks_memory() {
            return Err(NoMemoryFork {
                name: source.name,
                backend: source.backend,
            }
            .into());
        }
        let _lease = self.lease(name, "fork").await?;
        let request = CreateRequest {
            name: Some(name.to_owned()),
            spec: source.spec.clone(),
        };
        let sandbox = self.reserve(request, None)?;
        let key = self.sandbox_key(&source);
        let capture_name = format!("{CAPTURE_PREFIX}{}", sandbox.id);
        let captured = backend
            .capture_memory(machine(&source, &key), &capture_name)
            .await;
        let image = match captured {
            Ok(image) => image,
            Err(error) => {
                let error = backend_error("fork", &source, error);
                return Err(self.forget_failed(&sandbox, "fork", error)?);
            }
        };
        let launched = self.launch_from(sandbox, Some(&image), true).await;
        if launched.is_err()
            && let Err(error) = backend.drop_capture(&image).await
        {
            tracing::warn!(
                sandbox = name,
                capture = image,
                "deleting the capture of a failed fork: {error}"
            );
        }
        launched
    }
}
