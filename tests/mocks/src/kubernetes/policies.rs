//! NetworkPolicies (`networking.k8s.io/v1`): recorded and answered, never
//! enforced: a pod's traffic is whatever the engine allows. A policy needs
//! a `spec` with a `podSelector` (`{}` selects every pod), as the API
//! requires.

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::discovery::NETWORKING;
use super::objects::Stored;
use super::status::{FieldProblem, Kind};
use super::store::{Table, policies};

impl Stored for NetworkPolicy {
    const NAMES: Kind = Kind {
        kind: "NetworkPolicy",
        resource: "networkpolicies",
        group: NETWORKING,
    };
    const TABLE: Table<Self> = policies;

    fn admit(&mut self) -> Vec<FieldProblem> {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.pod_selector.get_or_insert_with(Default::default);
        let mut problems = Vec::new();
        for (i, kind) in spec.policy_types.iter().flatten().enumerate() {
            if !matches!(kind.as_str(), "Ingress" | "Egress") {
                problems.push(FieldProblem::not_supported(
                    format!("spec.policyTypes[{i}]"),
                    kind,
                    &["Ingress", "Egress"],
                ));
            }
        }
        problems
    }
}
