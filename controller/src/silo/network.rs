//! `Silo::set_network`: a running sandbox's outbound rules (`allow_out`,
//! `deny_out`) changed in place, by the provider's own update (E2B's
//! `PUT /sandboxes/{id}/network`, Daytona's `network-settings`), and the
//! sandbox's spec changed with them, so what silo records is what the
//! provider enforces. Backends whose rules are fixed at create refuse.
//!
//! The new lists replace the old ones whole, as both providers' updates
//! do; the spec is checked as a create's would be, so a rule the backend
//! cannot honour (a deny list on Daytona) is refused before any call.

use serde_json::json;

use super::{Silo, SiloError, backend_error, machine};
use crate::backend::Backend;
use crate::spec::{SpecError, egress};
use crate::state::{EventKind, SandboxRecord};

impl Silo {
    /// Replaces the outbound rules of the sandbox `name_or_id` with
    /// `allow_out` and `deny_out` (each as `--allow-out` and `--deny-out`
    /// take them; empty for none) at its provider and in its spec; answers
    /// the sandbox as recorded now. Unchanged rules ask the provider
    /// nothing.
    pub async fn set_network(
        &self,
        name_or_id: &str,
        allow_out: &[String],
        deny_out: &[String],
    ) -> Result<SandboxRecord, SiloError> {
        let (_lease, sandbox) = self.lease_sandbox(name_or_id, "network").await?;
        let mut spec = sandbox.spec.clone();
        spec.allow_out = egress::canonical(allow_out).map_err(|reason| SpecError::Invalid {
            setting: "allow-out",
            reason,
        })?;
        spec.deny_out =
            egress::canonical_denied(deny_out).map_err(|reason| SpecError::Invalid {
                setting: "deny-out",
                reason,
            })?;
        spec.check()?;
        if spec == sandbox.spec {
            return Ok(sandbox);
        }
        let changed = SandboxRecord {
            spec: spec.clone(),
            ..sandbox.clone()
        };
        let key = self.sandbox_key(&sandbox);
        self.backend_of(&sandbox)?
            .set_egress(machine(&changed, &key))
            .await
            .map_err(|error| backend_error("change the network rules of", &sandbox, error))?;
        let rules = |spec: &crate::spec::SandboxSpec| json!({ "allow_out": spec.allow_out, "deny_out": spec.deny_out });
        let detail = json!({ "before": rules(&sandbox.spec), "after": rules(&spec) });
        Ok(self
            .db()
            .update_spec(&sandbox, &spec, (EventKind::NetworkChanged, detail))?)
    }
}
