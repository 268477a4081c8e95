//! What a backend can honour: a spec is checked before anything is recorded
//! or made, so a setting the backend would silently ignore (an image on the
//! local backend) or the engine would reject late (a relative mount target)
//! is refused up front with a message naming the setting.

use super::{BackendKind, Egress, Machines, SandboxSpec};

/// Where silo mounts its own files in a container; sandbox mounts must stay out.
pub const RESERVED_TARGET: &str = "/.silo";
/// Label prefix reserved for silo's own labels.
pub const RESERVED_LABEL_PREFIX: &str = "silo.";

impl SandboxSpec {
    /// Checks that the spec's backend can honour every setting in it.
    pub fn check(&self) -> Result<(), SpecError> {
        if !self.workload.is_empty() && self.workload_from_image {
            return Err(SpecError::TwoWorkloads);
        }
        if self.restart.is_some() && self.workload.is_empty() && !self.workload_from_image {
            return Err(SpecError::RestartWithoutWorkload);
        }
        match self.backend.machines() {
            Machines::HostProcess => self.check_local(),
            Machines::Container => self.check_container(),
            Machines::ProviderVm => self.check_remote(),
            Machines::Pod => self.check_pod(),
        }
    }

    /// A pod: an image, and what a pod spec has a field for (see
    /// `backend::kubernetes::pod` for the mapping); the rest is refused by
    /// name.
    fn check_pod(&self) -> Result<(), SpecError> {
        let mapped = [
            "image",
            "workdir",
            "user",
            "network",
            "cpus",
            "memory",
            "cap-add",
            "privileged",
            "new-privileges",
            "runtime",
            "label",
        ];
        self.only(&mapped)?;
        let invalid =
            |setting: &'static str, reason: String| SpecError::Invalid { setting, reason };
        self.check_image_and_workdir()?;
        if let Some(network) = self.network.as_deref() {
            if !matches!(network, "none" | "bridge") {
                return Err(invalid(
                    "network",
                    format!("{network:?}: a pod has the cluster's network (bridge) or none"),
                ));
            }
        }
        if let Some(user) = self.user.as_deref() {
            if crate::backend::kubernetes::pod::numeric_user(user).is_none() {
                return Err(invalid(
                    "user",
                    format!("{user:?}: a pod runs as a numeric UID[:GID], not a name"),
                ));
            }
        }
        self.check_egress()
    }

    /// A provider VM: made from a template (the spec's image), with or
    /// without internet; the template fixes its size, and there is no host
    /// file system to mount.
    fn check_remote(&self) -> Result<(), SpecError> {
        self.only(&["image", "workdir", "network", "allow-out", "deny-out"])?;
        if let Some(network) = self.network.as_deref() {
            if !matches!(network, "none" | "bridge") {
                return Err(SpecError::Invalid {
                    setting: "network",
                    reason: format!(
                        "{network:?}: a {} sandbox has internet (bridge) or none",
                        self.backend
                    ),
                });
            }
        }
        if self.image.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(SpecError::Invalid {
                setting: "image",
                reason: "the template name is empty".into(),
            });
        }
        self.check_egress()
    }

    /// Outbound rules, as far as the backend's provider enforces them
    /// ([`Egress`]): refused by name where it enforces none, or no deny
    /// list; else each readable, not beside `--network none`, and within
    /// what the provider takes.
    fn check_egress(&self) -> Result<(), SpecError> {
        let egress = self.backend.egress();
        type Takes = fn(Egress) -> bool;
        let (setting, list, takes): (&'static str, &str, Takes) = if !self.allow_out.is_empty() {
            ("allow-out", "an allow-list", |egress| {
                egress != Egress::Unenforced
            })
        } else if !self.deny_out.is_empty() {
            ("deny-out", "a deny list", |egress| {
                egress == Egress::AllowAndDeny
            })
        } else {
            return Ok(());
        };
        if egress == Egress::Unenforced {
            let why = match self.backend.machines() {
                Machines::HostProcess => "its commands run on the host's network",
                _ => "its network is all or --network none",
            };
            let by: Vec<&str> = BackendKind::ALL
                .iter()
                .filter(|kind| takes(kind.egress()))
                .map(|kind| kind.as_str())
                .collect();
            let verb = if by.len() == 1 { "enforces" } else { "enforce" };
            return Err(SpecError::Invalid {
                setting,
                reason: format!(
                    "the {} backend cannot enforce {list} ({why}); {} {verb} one",
                    self.backend,
                    by.join(" and ")
                ),
            });
        }
        self.check_deny_out(egress)?;
        self.check_allow_out(egress)
    }

    /// A deny list: each entry an address or a block, not beside
    /// `--network none`, on a provider that has deny rules.
    fn check_deny_out(&self, egress: Egress) -> Result<(), SpecError> {
        if self.deny_out.is_empty() {
            return Ok(());
        }
        let invalid = |reason: String| SpecError::Invalid {
            setting: "deny-out",
            reason,
        };
        if egress == Egress::AllowOnly {
            return Err(invalid(format!(
                "the {} backend has no deny list (its rules only allow; \
                 --allow-out is the way to limit its outbound traffic)",
                self.backend
            )));
        }
        super::egress::canonical_denied(&self.deny_out).map_err(invalid)?;
        if self.offline() {
            return Err(invalid(
                "--network none blocks every destination; give one or the other".into(),
            ));
        }
        Ok(())
    }

    /// An allow-list: each destination readable, not beside `--network
    /// none`, and within what the provider takes.
    fn check_allow_out(&self, egress: Egress) -> Result<(), SpecError> {
        if self.allow_out.is_empty() {
            return Ok(());
        }
        let invalid = |reason: String| SpecError::Invalid {
            setting: "allow-out",
            reason,
        };
        super::egress::canonical(&self.allow_out).map_err(invalid)?;
        if self.offline() {
            return Err(invalid(
                "--network none blocks every destination; give one or the other".into(),
            ));
        }
        let (_, hosts) = super::egress::split(&self.allow_out);
        let denied = super::egress::canonical_denied(&self.deny_out).unwrap_or_default();
        if !hosts.is_empty()
            && !self.deny_out.is_empty()
            && !denied.iter().any(|d| d == super::egress::ALL_TRAFFIC)
        {
            // E2B lets a host name through only when every other
            // destination is denied.
            return Err(invalid(format!(
                "a host name ({}) is allowed only over --deny-out {}",
                hosts[0],
                super::egress::ALL_TRAFFIC
            )));
        }
        if egress == Egress::AllowOnly {
            let (cidrs, hosts) = super::egress::split(&self.allow_out);
            for (count, what) in [(cidrs.len(), "IPv4 blocks"), (hosts.len(), "host names")] {
                if count > DAYTONA_MAX_ALLOWED {
                    return Err(invalid(format!(
                        "{count} {what}: Daytona allows at most {DAYTONA_MAX_ALLOWED}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The container-only settings that are set, by their flag names.
    fn container_settings(&self) -> Vec<&'static str> {
        let set = [
            ("image", self.image.is_some()),
            ("workload image", self.workload_from_image),
            ("workdir", self.workdir.is_some()),
            ("user", self.user.is_some()),
            ("network", self.network.is_some()),
            ("allow-out", !self.allow_out.is_empty()),
            ("deny-out", !self.deny_out.is_empty()),
            ("bind", !self.binds.is_empty()),
            ("cpus", self.milli_cpus.is_some()),
            ("memory", self.memory_bytes.is_some()),
            ("pids-limit", self.pids_limit.is_some()),
            ("cap-add", !self.cap_add.is_empty()),
            ("privileged", self.privileged),
            ("new-privileges", self.new_privileges),
            ("runtime", self.runtime.is_some()),
            ("label", !self.labels.is_empty()),
        ];
        set.into_iter()
            .filter_map(|(name, is_set)| is_set.then_some(name))
            .collect()
    }

    /// Refuses, by name, every setting that is set but not `honoured`.
    fn only(&self, honoured: &[&str]) -> Result<(), SpecError> {
        let unsupported: Vec<&str> = self
            .container_settings()
            .into_iter()
            .filter(|name| !honoured.contains(name))
            .collect();
        if unsupported.is_empty() {
            return Ok(());
        }
        Err(SpecError::Unsupported {
            backend: self.backend,
            settings: unsupported.join(", "),
        })
    }

    /// An image is named and not empty, and a working directory, if any,
    /// is an absolute path (a container's and a pod's).
    fn check_image_and_workdir(&self) -> Result<(), SpecError> {
        let invalid =
            |setting: &'static str, reason: String| SpecError::Invalid { setting, reason };
        match self.image.as_deref() {
            None => return Err(SpecError::NoImage(self.backend)),
            Some(image) if image.trim().is_empty() => {
                return Err(invalid("image", "it is empty".into()));
            }
            Some(_) => {}
        }
        match &self.workdir {
            Some(dir) if !dir.starts_with('/') => Err(invalid(
                "workdir",
                format!("{dir:?} is not an absolute path"),
            )),
            _ => Ok(()),
        }
    }

    fn check_local(&self) -> Result<(), SpecError> {
        self.check_egress()?;
        self.only(&[])
    }

    fn check_container(&self) -> Result<(), SpecError> {
        let invalid =
            |setting: &'static str, reason: String| SpecError::Invalid { setting, reason };
        self.check_image_and_workdir()?;
        if self.network.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("network", "it is empty".into()));
        }
        self.check_egress()?;
        if self.user.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("user", "it is empty".into()));
        }
        for bind in &self.binds {
            if !bind.source.starts_with('/') || !bind.target.starts_with('/') {
                return Err(invalid(
                    "bind",
                    format!("{bind}: both paths must be absolute"),
                ));
            }
            let target = bind.target.trim_end_matches('/');
            if target.is_empty()
                || target == RESERVED_TARGET
                || target.starts_with(&format!("{RESERVED_TARGET}/"))
            {
                return Err(invalid(
                    "bind",
                    format!("{bind}: the target may not be / or under {RESERVED_TARGET}"),
                ));
            }
        }
        if let Some(key) = self
            .labels
            .keys()
            .find(|k| k.is_empty() || k.starts_with(RESERVED_LABEL_PREFIX))
        {
            return Err(invalid(
                "label",
                format!("{key:?}: labels starting with {RESERVED_LABEL_PREFIX:?} are silo's own"),
            ));
        }
        if self.pids_limit == Some(0) {
            return Err(invalid("pids-limit", "it must be at least 1".into()));
        }
        if let Some(cap) = self.cap_add.iter().find(|c| !is_capability_name(c)) {
            return Err(invalid(
                "cap-add",
                format!("{cap:?} is not a capability name (like NET_RAW or CAP_NET_RAW)"),
            ));
        }
        if self
            .cap_add
            .iter()
            .any(|c| c.strip_prefix("CAP_").unwrap_or(c) == EVERY_CAPABILITY)
        {
            // The engine reads ALL as every capability: privileged in all
            // but name, which only an explicit --privileged may give.
            return Err(invalid(
                "cap-add",
                "ALL would give every capability; --privileged is the one way to ask for that"
                    .into(),
            ));
        }
        if self.runtime.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err(invalid("runtime", "it is empty".into()));
        }
        Ok(())
    }
}

/// Most IPv4 blocks, and most host names, an allow-only provider takes
/// (Daytona, [`Egress::AllowOnly`]).
const DAYTONA_MAX_ALLOWED: usize = 10;

/// The engine's name for the whole capability set.
const EVERY_CAPABILITY: &str = "ALL";

/// `NET_RAW`, `CAP_NET_RAW`: capital letters and underscores.
fn is_capability_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// A spec its backend cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Container settings on a backend without containers.
    #[error("the {backend} backend has no containers, so it cannot honour: {settings}")]
    Unsupported {
        /// The backend.
        backend: BackendKind,
        /// The settings given, by flag name.
        settings: String,
    },
    /// A container backend without an image.
    #[error("the {0} backend needs an image (--image)")]
    NoImage(BackendKind),
    /// Both a command and the image's own entrypoint as the workload.
    #[error("give either a workload command or `--workload image`, not both")]
    TwoWorkloads,
    /// A restart policy with nothing to restart.
    #[error("`--restart` applies to a workload; give one (`--workload image` or `-- CMD...`)")]
    RestartWithoutWorkload,
    /// A setting with an unusable value.
    #[error("bad {setting}: {reason}")]
    Invalid {
        /// The setting, by flag name.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{BindMount, RestartPolicy};

    fn docker(image: &str) -> SandboxSpec {
        SandboxSpec {
            image: Some(image.into()),
            ..SandboxSpec::new(BackendKind::Docker)
        }
    }

    #[test]
    fn local_refuses_container_settings_by_name() {
        let mut spec = SandboxSpec::new(BackendKind::Local);
        assert_eq!(spec.check(), Ok(()));
        spec.image = Some("busybox".into());
        spec.memory_bytes = Some(1 << 30);
        let err = spec.check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the local backend has no containers, so it cannot honour: image, memory"
        );
    }

    #[test]
    fn every_capability_is_only_had_through_privileged() {
        for all in ["ALL", "CAP_ALL"] {
            let mut spec = docker("busybox");
            spec.cap_add = vec!["NET_RAW".into(), all.into()];
            let err = spec.check().unwrap_err().to_string();
            assert!(err.contains("--privileged"), "{err}");
        }
        let mut spec = docker("busybox");
        spec.privileged = true;
        assert_eq!(spec.check(), Ok(()));
    }

    #[test]
    fn docker_needs_an_image_and_sane_paths_and_labels() {
        assert_eq!(
            SandboxSpec::new(BackendKind::Docker).check(),
            Err(SpecError::NoImage(BackendKind::Docker))
        );
        // Podman's machines are containers too, held to the same settings.
        assert_eq!(
            SandboxSpec::new(BackendKind::Podman).check(),
            Err(SpecError::NoImage(BackendKind::Podman))
        );
        assert_eq!(docker("busybox").check(), Ok(()));
        let mut spec = docker("busybox");
        spec.workdir = Some("work".into());
        assert!(spec.check().is_err());
        for target in ["/", "/.silo", "/.silo/run", "rel"] {
            let mut spec = docker("busybox");
            spec.binds.push(BindMount {
                source: "/tmp".into(),
                target: target.into(),
                read_only: false,
            });
            assert!(spec.check().is_err(), "{target} accepted");
        }
        let mut spec = docker("busybox");
        spec.labels.insert("silo.sandbox.id".into(), "x".into());
        assert!(spec.check().is_err());
        let mut spec = docker("busybox");
        spec.workload = vec!["sleep".into()];
        spec.workload_from_image = true;
        assert_eq!(spec.check(), Err(SpecError::TwoWorkloads));
    }

    #[test]
    fn a_restart_policy_needs_a_workload() {
        let mut spec = docker("busybox");
        spec.restart = Some(RestartPolicy::Always);
        assert_eq!(spec.check(), Err(SpecError::RestartWithoutWorkload));
        spec.workload_from_image = true;
        assert_eq!(spec.check(), Ok(()));
        let mut spec = SandboxSpec::new(BackendKind::Local);
        spec.restart = Some(RestartPolicy::Never);
        spec.workload = vec!["sleep".into(), "1".into()];
        assert_eq!(spec.check(), Ok(()));
    }

    #[test]
    fn a_deny_list_is_e2bs_alone_and_takes_host_exceptions_only_over_everything() {
        let mut spec = SandboxSpec::new(BackendKind::E2b);
        spec.deny_out = vec!["10.0.0.0/8".into()];
        spec.allow_out = vec!["10.1.0.0/16".into()];
        assert_eq!(spec.check(), Ok(()));
        spec.allow_out = vec!["pypi.org".into()];
        let err = spec.check().unwrap_err().to_string();
        assert!(err.contains("only over --deny-out 0.0.0.0/0"), "{err}");
        spec.deny_out = vec!["0.0.0.0/0".into()];
        assert_eq!(spec.check(), Ok(()));
        spec.deny_out = vec!["example.com".into()];
        let err = spec.check().unwrap_err().to_string();
        assert!(
            err.starts_with("bad deny-out") && err.contains("host name"),
            "{err}"
        );
        for backend in [
            BackendKind::Daytona,
            BackendKind::Local,
            BackendKind::Docker,
        ] {
            let mut spec = SandboxSpec::new(backend);
            spec.image = (backend == BackendKind::Docker).then(|| "busybox".into());
            spec.deny_out = vec!["10.0.0.0/8".into()];
            let err = spec.check().unwrap_err().to_string();
            assert!(
                err.starts_with("bad deny-out") && err.contains(backend.as_str()),
                "{err}"
            );
        }
    }
}
