//! The confinement every Docker sandbox starts with, and how a spec loosens
//! it. Code in a sandbox is untrusted (an AI agent wrote it), so the engine's
//! default capability set is cut to what package installs and ordinary
//! programs use, setuid programs cannot gain privileges, and the number of
//! processes is bounded. Each default has one flag that loosens it, and
//! `--privileged` is never implied.

use bollard::models::HostConfig;

use crate::spec::SandboxSpec;

/// Capabilities of the engine's default set that a sandbox does not get,
/// each with why it goes:
/// - `NET_RAW`: raw and packet sockets, to forge traffic on the network
///   (`ping` needs it: `--cap-add NET_RAW`);
/// - `MKNOD`: creating device nodes;
/// - `AUDIT_WRITE`: writing to the kernel's audit log;
/// - `SETFCAP`: putting capabilities on files, to be gained on exec;
/// - `SETPCAP`: changing capability sets of its own threads beyond the usual;
/// - `SYS_CHROOT`: `chroot`, a step in several escape techniques.
///
/// Kept: `CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID` (package managers set
/// owners and modes), `SETUID`/`SETGID` (they drop to service users),
/// `KILL` (the agent stops and continues every process of the sandbox for a
/// snapshot, and kills what an interrupt leaves, whatever user runs it) and
/// `NET_BIND_SERVICE` (a dev server on port 80).
pub const DROPPED_CAPABILITIES: &[&str] = &[
    "NET_RAW",
    "MKNOD",
    "AUDIT_WRITE",
    "SETFCAP",
    "SETPCAP",
    "SYS_CHROOT",
];

/// Processes a sandbox may have at once unless its spec says otherwise: far
/// above what builds and test runners use, far below what a fork bomb needs
/// to hurt the host.
pub const DEFAULT_PIDS_LIMIT: u64 = 4096;

/// The security option that stops setuid programs from gaining privileges.
const NO_NEW_PRIVILEGES: &str = "no-new-privileges";

/// Applies the defaults, as loosened by `spec`, to a container's host config.
pub fn confine(spec: &SandboxSpec, host: &mut HostConfig) {
    host.pids_limit = i64::try_from(spec.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT)).ok();
    host.runtime = spec.runtime.clone();
    if spec.privileged {
        host.privileged = Some(true);
        return;
    }
    let given_back: Vec<&str> = spec
        .cap_add
        .iter()
        .map(|c| c.strip_prefix("CAP_").unwrap_or(c))
        .collect();
    host.cap_drop = Some(
        DROPPED_CAPABILITIES
            .iter()
            .filter(|cap| !given_back.contains(cap))
            .map(|cap| (*cap).to_owned())
            .collect(),
    );
    let extra: Vec<String> = given_back
        .iter()
        .filter(|cap| !DROPPED_CAPABILITIES.contains(cap))
        .map(|cap| (*cap).to_owned())
        .collect();
    host.cap_add = (!extra.is_empty()).then_some(extra);
    if !spec.new_privileges {
        host.security_opt = Some(vec![NO_NEW_PRIVILEGES.to_owned()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::BackendKind;

    fn confined(edit: impl FnOnce(&mut SandboxSpec)) -> HostConfig {
        let mut spec = SandboxSpec::new(BackendKind::Docker);
        edit(&mut spec);
        let mut host = HostConfig::default();
        confine(&spec, &mut host);
        host
    }

    #[test]
    fn defaults_drop_capabilities_forbid_new_privileges_and_bound_pids() {
        let host = confined(|_| {});
        assert_eq!(
            host.cap_drop.as_deref().map(<[String]>::len),
            Some(DROPPED_CAPABILITIES.len())
        );
        assert_eq!(host.cap_add, None);
        assert_eq!(host.security_opt, Some(vec![NO_NEW_PRIVILEGES.to_owned()]));
        assert_eq!(host.pids_limit, Some(4096));
        assert_eq!(host.privileged, None);
        assert_eq!(host.runtime, None);
    }

    #[test]
    fn each_flag_loosens_one_default() {
        let host = confined(|s| s.cap_add = vec!["CAP_NET_RAW".into(), "SYS_PTRACE".into()]);
        let dropped = host.cap_drop.unwrap_or_default();
        assert!(!dropped.contains(&"NET_RAW".to_owned()));
        assert!(dropped.contains(&"MKNOD".to_owned()));
        assert_eq!(host.cap_add, Some(vec!["SYS_PTRACE".to_owned()]));
        let host = confined(|s| s.new_privileges = true);
        assert_eq!(host.security_opt, None);
        let host = confined(|s| s.pids_limit = Some(100));
        assert_eq!(host.pids_limit, Some(100));
        let host = confined(|s| {
            s.privileged = true;
            s.runtime = Some("runsc".into());
        });
        assert_eq!((host.privileged, host.cap_drop), (Some(true), None));
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
    }
}
