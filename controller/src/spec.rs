//! What a sandbox is asked to be: its backend and the settings it was made with.
//!
//! The spec is stored with the sandbox, and its hash decides whether an existing
//! sandbox may be reused for a request (a changed spec is never silently
//! reused). The hash is SHA-256 over the spec's JSON, which is deterministic
//! because fields serialize in declaration order and maps are ordered.
//!
//! Compatibility rule for new fields: give them `#[serde(default)]` and skip
//! them when unset, so every spec stored before the field existed keeps its hash.
//!
//! Layout: `parse` (the text forms people type: bind mounts, CPU and memory
//! sizes), `check` (what a backend can honour), `diff` (what changed between
//! two specs, for the error that refuses to reuse a drifted sandbox).

mod check;
mod diff;
pub mod egress;
mod parse;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
pub use silo_protocol::workload::RestartPolicy;

pub use check::SpecError;
pub use parse::{BindMount, ParseError, parse_cpus, parse_memory};

/// Every backend this build has, one line each, handed to the macro `$then`:
/// the backend's variant and name (its [`BackendKind`]), what its machines
/// are (the [`Machines`] a spec is checked against), which outbound rules
/// its provider enforces ([`Egress`]), and its folder under
/// `backend/` with the backend and error types in it, for the registry
/// (`backend::register_backends!`). Adding a backend is its folder (and
/// its `mod` line) and one line here; the backend types are only named
/// here, for the backend layer's expansion to use.
macro_rules! backends {
    ($then:ident) => {
        $then! {
            /// The agent as a plain host process: no isolation, for development and tests.
            Local = "local", HostProcess, Unenforced => local: LocalBackend, LocalError;
            /// A container on a Docker engine, the agent bind-mounted in as PID 1.
            Docker = "docker", Container, Unenforced => docker: DockerBackend, DockerError;
            /// An E2B sandbox (a VM from a template), the agent uploaded and started
            /// beside E2B's own daemon, reached through E2B's proxy.
            E2b = "e2b", ProviderVm, AllowAndDeny => e2b: E2bBackend, E2bError;
            /// A Daytona sandbox (from a Daytona snapshot), the agent uploaded and
            /// started through its toolbox, reached through its preview proxy.
            Daytona = "daytona", ProviderVm, AllowOnly => daytona: DaytonaBackend, DaytonaError;
            /// A container on a Podman engine, as on Docker, through Podman's
            /// Docker-compatible API socket.
            Podman = "podman", Container, Unenforced => podman: PodmanBackend, PodmanError;
            /// A pod in a Kubernetes cluster, the agent its PID 1, reached at the
            /// pod's address or through the API server's port-forward.
            Kubernetes = "kubernetes", Pod, Unenforced => kubernetes: KubernetesBackend, KubernetesError;
        }
    };
}
pub(crate) use backends;

/// What a backend's machines are, which decides what a spec may ask of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machines {
    /// The agent as a host process: no image, no container settings.
    HostProcess,
    /// A container made from an image, with every container setting.
    Container,
    /// A provider's VM made from its template, with internet or none.
    ProviderVm,
    /// A pod in a cluster: an image, with the settings a pod spec has.
    Pod,
}

/// Which outbound rules (`allow_out`, `deny_out`) a backend's provider
/// enforces, which decides whether a spec may name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// None: the machine's network is all or nothing (`--network none`).
    Unenforced,
    /// Allow-lists only, at most ten IPv4 blocks and ten host names
    /// (Daytona's `networkAllowList` and `domainAllowList`).
    AllowOnly,
    /// Allow and deny lists, an allowed entry winning (E2B's `allowOut`
    /// and `denyOut`).
    AllowAndDeny,
}

/// Makes [`BackendKind`] from the lines of `backends!`.
macro_rules! backend_kind {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $machines:ident, $egress:ident
        => $field:ident: $backend:ident, $error:ident;)+) => {
        /// Which kind of machine a sandbox runs on.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum BackendKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)+
        }

        impl BackendKind {
            /// Every backend this build knows, in the order `--help` lists them.
            pub const ALL: &'static [BackendKind] = &[$(BackendKind::$variant,)+];

            /// The name used in the CLI, the database and JSON.
            pub fn as_str(self) -> &'static str {
                match self { $(BackendKind::$variant => $name,)+ }
            }

            /// What its machines are.
            pub fn machines(self) -> Machines {
                match self { $(BackendKind::$variant => Machines::$machines,)+ }
            }

            /// Which outbound rules its provider enforces.
            pub fn egress(self) -> Egress {
                match self { $(BackendKind::$variant => Egress::$egress,)+ }
            }
        }
    };
}

backends!(backend_kind);

impl Default for BackendKind {
    /// The local backend: what a spec with no image runs on.
    fn default() -> Self {
        BackendKind::Local
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .iter()
            .copied()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_owned()))
    }
}

/// A backend name this build does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown backend {0:?} (known: {known})", known = known_backends())]
pub struct UnknownBackend(pub String);

fn known_backends() -> String {
    let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

/// The settings a sandbox is created with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The backend that runs it.
    pub backend: BackendKind,
    /// A command the agent supervises for the sandbox's whole life (a server,
    /// a notebook); none when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload: Vec<String>,
    /// When the agent starts the workload again after it exits; the agent's
    /// default (`on-failure`) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
    /// Environment given to the agent, and so to every command run in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The agent exits (stopping the sandbox) after this long without a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// The image a container sandbox runs (container backends only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Supervise the image's own entrypoint and command as the workload
    /// (resolved when the machine is made; exclusive with `workload`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub workload_from_image: bool,
    /// Default working directory of commands; the image's, or `/`, when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// User (name, or `uid[:gid]`) the agent, and so every command, runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `none`, `bridge` or the name of an engine network; `bridge` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The only destinations outbound traffic may reach (IPv4 addresses,
    /// CIDR blocks, host names; [`egress`]), enforced by the provider; no
    /// rule when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// The IPv4 addresses and blocks outbound traffic may not reach
    /// ([`egress`]; E2B only), `allow_out` naming exceptions; no rule
    /// when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    /// Host directories mounted into the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<BindMount>,
    /// CPU limit in thousandths of a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli_cpus: Option<u64>,
    /// Memory limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Most processes the sandbox may have at once; silo's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    /// Capabilities given back on top of silo's reduced default set (a
    /// container backend's security defaults), e.g. `NET_RAW` for `ping`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
    /// Run privileged (every capability and device, no confinement); only
    /// ever when asked for by name.
    #[serde(default, skip_serializing_if = "is_false")]
    pub privileged: bool,
    /// Let setuid programs (`sudo`, `su`) gain privileges; off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub new_privileges: bool,
    /// The engine's container runtime (`runsc` for gVisor); the engine's
    /// default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Extra labels on the machine (silo's own labels cannot be overridden).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl SandboxSpec {
    /// A spec with every setting at its default.
    pub fn new(backend: BackendKind) -> Self {
        Self {
            backend,
            ..Self::default()
        }
    }

    /// Whether the sandbox has no network at all (`--network none`), which
    /// every backend's outbound rules follow.
    pub fn offline(&self) -> bool {
        self.network.as_deref() == Some("none")
    }

    /// Lowercase hex SHA-256 of the spec's canonical JSON.
    pub fn hash(&self) -> String {
        // Serializing plain data into a Vec cannot fail; fall back to Debug so a
        // future field that could fail still hashes deterministically.
        let json = serde_json::to_vec(self).unwrap_or_else(|_| format!("{self:?}").into_bytes());
        hex::encode(Sha256::digest(json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip() {
        for kind in BackendKind::ALL {
            assert_eq!(kind.as_str().parse::<BackendKind>(), Ok(*kind));
        }
        let err = "nope".parse::<BackendKind>().unwrap_err();
        assert!(err.to_string().contains("local"), "{err}");
    }

    #[test]
    fn spec_hash_is_stable() {
        // Pinned: a change here means every stored sandbox looks changed.
        let spec = SandboxSpec::new(BackendKind::Local);
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"backend":"local"}"#
        );
        assert_eq!(
            spec.hash(),
            "4a91514c154a370c843bac4463f9b60f573eeeabbb0dec8b83efc5104cbdb982"
        );
    }

    #[test]
    fn spec_hash_sees_every_setting_and_ignores_map_insertion_order() {
        let base = SandboxSpec::new(BackendKind::Local);
        let mut a = base.clone();
        a.env.insert("A".into(), "1".into());
        a.env.insert("B".into(), "2".into());
        let mut b = base.clone();
        b.env.insert("B".into(), "2".into());
        b.env.insert("A".into(), "1".into());
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), base.hash());
        let mut c = base.clone();
        c.idle_timeout_secs = Some(60);
        assert_ne!(c.hash(), base.hash());
        let mut d = base.clone();
        d.workload = vec!["sleep".into(), "inf".into()];
        assert_ne!(d.hash(), base.hash());
    }

    #[test]
    fn stored_specs_tolerate_absent_optionals() {
        let spec: SandboxSpec = serde_json::from_str(r#"{"backend":"local"}"#).unwrap();
        assert_eq!(spec, SandboxSpec::new(BackendKind::Local));
    }
}
