//! What a sandbox's container is made of: the create request sent to the
//! engine, derived from the spec, the image's own config and silo's files.
//!
//! Any image works unchanged. The static agent is bind-mounted read-only at
//! [`AGENT_PATH`] and replaces the image's entrypoint; the image's
//! entrypoint and command run only if asked for (`--workload image`), as the
//! agent's supervised workload. A host directory is mounted at [`RUN_DIR`]
//! for the agent's socket and key, so the controller reaches the agent
//! through the file system whatever the sandbox's network (`none` included).

use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HostConfig, ImageInspect, Mount, MountType, ResourcesUlimits,
    RestartPolicy, RestartPolicyNameEnum,
};

use super::error::DockerError;
use super::labels::labels;
use crate::backend::{Machine, agent_flags};
use crate::spec::SandboxSpec;

/// Where the agent binary is mounted in every container.
pub const AGENT_PATH: &str = "/.silo/silo-agent";
/// Where the sandbox's run directory (socket and key) is mounted.
pub const RUN_DIR: &str = "/.silo/run";
/// The agent's socket, seen from inside the container.
const SOCKET_IN_CONTAINER: &str = "/.silo/run/agent.sock";
/// The agent's key file, seen from inside the container.
const KEY_IN_CONTAINER: &str = "/.silo/run/agent.key";
/// Seconds the engine waits after SIGTERM before SIGKILL on stop: the agent
/// needs its own shutdown grace (5 s) and session flush (1 s) first.
pub const STOP_TIMEOUT_SECS: i64 = 10;
/// The network a sandbox joins when its spec names none.
pub const DEFAULT_NETWORK: &str = "bridge";
/// Label `silo image bake` puts on the images it makes.
pub const BAKED_LABEL: &str = "silo.baked-from";
/// Nanoseconds of CPU time per thousandth of a CPU (the engine's `NanoCpus` unit).
const NANOS_PER_MILLI_CPU: i64 = 1_000_000;

/// Everything a container is made from.
pub struct Plan<'a> {
    /// The sandbox.
    pub machine: &'a Machine<'a>,
    /// The image, as the engine describes it; only needed (and only
    /// fetched) when its entrypoint and command become the workload.
    pub image: Option<&'a ImageInspect>,
    /// The agent binary on the host.
    pub agent: &'a Path,
    /// The sandbox's run directory on the host.
    pub run_dir: &'a Path,
    /// This home's identity label.
    pub home_id: &'a str,
    /// Resource limits the engine needs set explicitly (see
    /// [`super::Flavor::ulimits`]).
    pub ulimits: &'a [(&'static str, i64, i64)],
}

/// The create request for a sandbox's container.
pub fn create_body(plan: &Plan<'_>) -> Result<ContainerCreateBody, DockerError> {
    let spec = plan.machine.spec;
    let image_config = plan
        .image
        .and_then(|i| i.config.clone())
        .unwrap_or_default();
    let workload = if spec.workload_from_image {
        // A baked image's entrypoint is the agent itself; its workload is
        // its command alone (one agent per sandbox, never one in another).
        let baked = image_config
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(BAKED_LABEL));
        let mut argv = if baked {
            Vec::new()
        } else {
            image_config.entrypoint.clone().unwrap_or_default()
        };
        argv.extend(image_config.cmd.clone().unwrap_or_default());
        if argv.is_empty() {
            return Err(DockerError::NoImageWorkload(
                spec.image.clone().unwrap_or_default(),
            ));
        }
        argv
    } else {
        spec.workload.clone()
    };

    let mut entrypoint: Vec<String> = [
        AGENT_PATH,
        "--listen",
        &format!("unix:{SOCKET_IN_CONTAINER}"),
        "--key-file",
        KEY_IN_CONTAINER,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // Without a workdir in the spec, the agent keeps the one the engine
    // starts it in: the image's, or `/`. (The engine creates a spec's
    // workdir if the image lacks it.)
    entrypoint.extend(agent_flags(spec, &workload));

    Ok(ContainerCreateBody {
        image: Some(image_ref(plan.machine).to_owned()),
        entrypoint: Some(entrypoint),
        // An explicit entrypoint already keeps the engine from appending the
        // image's command; an empty one says so outright.
        cmd: Some(Vec::new()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: spec.workdir.clone(),
        user: spec.user.clone(),
        labels: Some(labels(plan.machine, plan.home_id)),
        // The agent is PID 1 and shuts down in order on SIGTERM, whatever
        // signal the image asks for.
        stop_signal: Some("SIGTERM".to_owned()),
        stop_timeout: Some(STOP_TIMEOUT_SECS),
        tty: Some(false),
        open_stdin: Some(false),
        attach_stdin: Some(false),
        host_config: Some(host_config(plan)),
        ..Default::default()
    })
}

/// Paths of a container that belong to silo or the engine rather than the
/// sandbox, left out of its snapshots: the agent and its run directory, the
/// files the engine writes for each container, the kernel's file systems,
/// and the spec's bind mounts (host directories are not the sandbox's).
pub fn snapshot_excludes(spec: &SandboxSpec) -> Vec<String> {
    let mut paths: Vec<String> = [
        "/.silo",
        "/.dockerenv",
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
        "/etc/mtab",
        "/proc",
        "/sys",
        "/dev",
    ]
    .iter()
    .map(|p| (*p).to_owned())
    .collect();
    paths.extend(spec.binds.iter().map(|b| b.target.clone()));
    paths
}

/// The image a sandbox's container is made from: a snapshot's when the
/// machine is restored from one, else the spec's.
pub fn image_ref<'a>(machine: &Machine<'a>) -> &'a str {
    machine
        .image
        .or(machine.spec.image.as_deref())
        .unwrap_or_default()
}

fn host_config(plan: &Plan<'_>) -> HostConfig {
    let spec = plan.machine.spec;
    let bind = |source: &str, target: &str, read_only: bool| Mount {
        typ: Some(MountType::BIND),
        source: Some(source.to_owned()),
        target: Some(target.to_owned()),
        read_only: Some(read_only),
        ..Default::default()
    };
    let mut mounts = vec![
        bind(&plan.agent.to_string_lossy(), AGENT_PATH, true),
        bind(&plan.run_dir.to_string_lossy(), RUN_DIR, false),
    ];
    mounts.extend(
        spec.binds
            .iter()
            .map(|b| bind(&b.source, &b.target, b.read_only)),
    );
    let mut host = HostConfig {
        mounts: Some(mounts),
        network_mode: Some(
            spec.network
                .clone()
                .unwrap_or_else(|| DEFAULT_NETWORK.to_owned()),
        ),
        nano_cpus: spec
            .milli_cpus
            .and_then(|m| i64::try_from(m).ok())
            .map(|m| m.saturating_mul(NANOS_PER_MILLI_CPU)),
        memory: spec.memory_bytes.and_then(|b| i64::try_from(b).ok()),
        // Only silo starts a sandbox: an engine restart policy would revive
        // containers that stopped on their idle timeout.
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::NO),
            maximum_retry_count: None,
        }),
        // The agent is the init; the engine's would hide it from PID 1.
        init: Some(false),
        auto_remove: Some(false),
        ulimits: (!plan.ulimits.is_empty()).then(|| {
            plan.ulimits
                .iter()
                .map(|&(name, soft, hard)| ResourcesUlimits {
                    name: Some(name.to_owned()),
                    soft: Some(soft),
                    hard: Some(hard),
                })
                .collect()
        }),
        ..Default::default()
    };
    super::security::confine(spec, &mut host);
    host
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{BackendKind, BindMount, SandboxSpec};
    use bollard::models::ImageConfig;
    use silo_protocol::auth::Key;

    fn plan_body(
        spec: &SandboxSpec,
        image: &ImageInspect,
    ) -> Result<ContainerCreateBody, DockerError> {
        plan_body_with(spec, image, &[])
    }

    fn plan_body_with(
        spec: &SandboxSpec,
        image: &ImageInspect,
        ulimits: &[(&'static str, i64, i64)],
    ) -> Result<ContainerCreateBody, DockerError> {
        let key = Key::from_hex(&"11".repeat(32)).unwrap();
        let backend_ref = serde_json::json!({});
        let machine = Machine {
            id: "sbx-00000000000a",
            name: "a",
            spec,
            backend_ref: &backend_ref,
            key: &key,
            image: None,
            agent_in_image: false,
            from_memory: false,
        };
        create_body(&Plan {
            machine: &machine,
            image: Some(image),
            agent: Path::new("/home/u/.local/share/silo/bin/silo-agent-x"),
            run_dir: Path::new("/home/u/.local/share/silo/sandboxes/sbx-00000000000a/run"),
            home_id: "h1",
            ulimits,
        })
    }

    #[test]
    fn an_engine_s_explicit_limits_are_set_and_docker_s_defaults_kept() {
        let mut spec = SandboxSpec::new(BackendKind::Docker);
        spec.image = Some("busybox".into());
        let image = image_with(&[], &[], "");
        let docker = plan_body(&spec, &image).unwrap().host_config.unwrap();
        assert_eq!(docker.ulimits, None, "Docker's engine keeps its defaults");
        let limits = [("nofile", 1024, 1024), ("nproc", 4096, 4096)];
        let host = plan_body_with(&spec, &image, &limits)
            .unwrap()
            .host_config
            .unwrap();
        let set: Vec<_> = host
            .ulimits
            .unwrap()
            .into_iter()
            .map(|u| (u.name.unwrap(), u.soft.unwrap(), u.hard.unwrap()))
            .collect();
        assert_eq!(
            set,
            [
                ("nofile".to_owned(), 1024, 1024),
                ("nproc".to_owned(), 4096, 4096)
            ]
        );
    }

    fn image_with(entrypoint: &[&str], cmd: &[&str], workdir: &str) -> ImageInspect {
        let strings = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect());
        ImageInspect {
            config: Some(ImageConfig {
                entrypoint: strings(entrypoint),
                cmd: strings(cmd),
                working_dir: Some(workdir.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_agent_replaces_the_entrypoint_and_the_image_workload_follows_it() {
        let mut spec = SandboxSpec::new(BackendKind::Docker);
        spec.image = Some("web:1".into());
        spec.idle_timeout_secs = Some(30);
        let image = image_with(&["/entry"], &["serve", "--port", "80"], "/srv");
        let body = plan_body(&spec, &image).unwrap();
        let entry = body.entrypoint.clone().unwrap();
        assert_eq!(entry[0], AGENT_PATH);
        assert!(
            !entry.contains(&"--workdir".to_owned()),
            "the image's workdir applies"
        );
        assert_eq!(body.working_dir, None);
        assert!(entry.windows(2).any(|w| w == ["--idle-timeout", "30"]));
        assert!(
            !entry.contains(&"--".to_owned()),
            "no workload unless asked"
        );

        spec.workload_from_image = true;
        let entry = plan_body(&spec, &image).unwrap().entrypoint.unwrap();
        let dashes = entry.iter().position(|a| a == "--").unwrap();
        assert_eq!(entry[dashes + 1..], ["/entry", "serve", "--port", "80"]);

        let mut baked = image_with(&["/usr/local/bin/silo-agent", "--"], &["serve"], "");
        if let Some(config) = baked.config.as_mut() {
            config.labels = Some([(BAKED_LABEL.to_owned(), "web:1".to_owned())].into());
        }
        let entry = plan_body(&spec, &baked).unwrap().entrypoint.unwrap();
        assert_eq!(entry.last().map(String::as_str), Some("serve"));
        assert_eq!(entry.iter().filter(|a| a.contains("silo-agent")).count(), 1);

        let empty = image_with(&[], &[], "");
        assert!(matches!(
            plan_body(&spec, &empty),
            Err(DockerError::NoImageWorkload(_))
        ));
    }

    #[test]
    fn mounts_limits_and_labels_follow_the_spec() {
        let mut spec = SandboxSpec::new(BackendKind::Docker);
        spec.image = Some("busybox".into());
        spec.binds.push(BindMount {
            source: "/data".into(),
            target: "/mnt/data".into(),
            read_only: true,
        });
        spec.milli_cpus = Some(1500);
        spec.memory_bytes = Some(256 << 20);
        spec.network = Some("none".into());
        spec.workdir = Some("/work".into());
        let body = plan_body(&spec, &image_with(&[], &[], "")).unwrap();
        assert_eq!(body.working_dir.as_deref(), Some("/work"));
        let entry = body.entrypoint.clone().unwrap();
        assert!(entry.windows(2).any(|w| w == ["--workdir", "/work"]));
        let host = body.host_config.unwrap();
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(host.memory, Some(256 << 20));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        let mounts = host.mounts.unwrap();
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].target.as_deref(), Some(AGENT_PATH));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[1].target.as_deref(), Some(RUN_DIR));
        assert_eq!(mounts[2].read_only, Some(true));
        let labels = body.labels.unwrap();
        assert_eq!(labels["silo.sandbox.id"], "sbx-00000000000a");
        assert_eq!(labels["silo.home"], "h1");
        assert_eq!(labels["silo.spec.hash"], spec.hash());
    }
}
