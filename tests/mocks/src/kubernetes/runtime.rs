//! A pod's containers on the engine: how a Kubernetes container becomes a
//! Docker one, and the calls a kubelet makes (create, start, wait, stop,
//! remove, logs).
//!
//! The mapping: `command` replaces the image's entrypoint and `args` its
//! command, as Kubernetes defines them (a `command` alone drops the image's
//! command); `$(VAR)` in them and in `env` values expands from the
//! container's environment (`$$` escapes it); `env` values (never
//! `valueFrom`, refused at create); `workingDir`; every `containerPort` of
//! the app container published on the pod's address under the same number;
//! `resources.limits` `cpu` (NanoCpus) and `memory` (bytes); the
//! container's or else the pod's `runAsUser`/`runAsGroup` as the engine's
//! user, `runAsNonRoot` checked against it and the image's user;
//! `privileged`, `capabilities`, `readOnlyRootFilesystem`,
//! `allowPrivilegeEscalation: false` (`no-new-privileges`) and an
//! `Unconfined` seccomp profile; the pod's name as hostname;
//! `runtimeClassName` `runsc` or `gvisor` as the engine's `runsc` runtime
//! when the engine has one. Containers are named as the kubelet's Docker
//! integration names them (`k8s_{container}_{pod}_{namespace}_{uid}_{attempt}`)
//! and carry the instance's labels.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::model::parse_docker_time;
use super::quantity;
use crate::containers::{ContainerError, Engine, engine as engine_failure};

/// Label: the pod's name, as the kubelet's Docker integration labels containers.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label: the pod's uid.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the container's name in the pod.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The engine's runtime for `runtimeClassName` `runsc` or `gvisor`.
pub const RUNSC: &str = "runsc";
/// Most log bytes `GET …/log` answers.
pub const MAX_LOG_BYTES: usize = 4 << 20;

/// Why a container could not be made or run, as the kubelet reports it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The spec cannot become a container (`CreateContainerConfigError`).
    #[error("{0}")]
    Config(String),
    /// The engine refused to create it (`CreateContainerError`).
    #[error("{0}")]
    Create(ContainerError),
    /// The engine refused to start it (`RunContainerError`).
    #[error("{0}")]
    Start(ContainerError),
    /// Anything else the engine failed at.
    #[error(transparent)]
    Engine(#[from] ContainerError),
}

impl RuntimeError {
    /// The waiting reason Kubernetes shows for it.
    pub fn reason(&self) -> &'static str {
        match self {
            RuntimeError::Config(_) => "CreateContainerConfigError",
            RuntimeError::Create(_) | RuntimeError::Engine(_) => "CreateContainerError",
            RuntimeError::Start(_) => "RunContainerError",
        }
    }
}

/// How a container ended.
#[derive(Debug, Clone, Default)]
pub struct Exit {
    /// Its exit code (128 + n for signal n).
    pub code: i32,
    /// Whether the kernel killed it for memory.
    pub oom_killed: bool,
    /// When it started.
    pub started_at: Option<Time>,
    /// When it ended.
    pub finished_at: Option<Time>,
}

/// One container to make for a pod.
pub struct Launch<'a> {
    /// The pod (metadata and spec).
    pub pod: &'a Pod,
    /// The container.
    pub container: &'a Container,
    /// Whether it is the app container (its ports are published).
    pub app: bool,
    /// How many times it ran before.
    pub attempt: u32,
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// Its volume binds.
    pub binds: Vec<String>,
    /// Whether the engine has the `runsc` runtime.
    pub runsc: bool,
}

/// Expands `$(NAME)` from `env` as Kubernetes does: `$$` is a literal `$`,
/// an unknown name stays as written.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(close) => {
                    let name = &inner[..close];
                    match env.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[close + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment in order, each value expanded from those before it.
pub fn environment(container: &Container) -> Vec<(String, String)> {
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for var in container.env.iter().flatten() {
        let value = expand(var.value.as_deref().unwrap_or_default(), &seen);
        seen.insert(var.name.clone(), value.clone());
        out.push((var.name.clone(), value));
    }
    out
}

/// The engine's user for a container (`uid` or `uid:gid`), if the spec sets one.
fn user(container: &Container, pod: Option<&PodSecurityContext>) -> Option<String> {
    let own = container.security_context.as_ref();
    let uid = own
        .and_then(|s| s.run_as_user)
        .or_else(|| pod.and_then(|p| p.run_as_user));
    let gid = own
        .and_then(|s| s.run_as_group)
        .or_else(|| pod.and_then(|p| p.run_as_group));
    match (uid, gid) {
        (Some(u), Some(g)) => Some(format!("{u}:{g}")),
        (Some(u), None) => Some(u.to_string()),
        // A group alone needs the image's user, which the engine cannot
        // combine with a group by number; it is left to the image.
        _ => None,
    }
}

/// Whether the container must not run as root.
fn non_root(container: &Container, pod: Option<&PodSecurityContext>) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| pod.and_then(|p| p.run_as_non_root))
        .unwrap_or(false)
}

/// The engine's name of a container.
pub fn container_name(pod: &Pod, container: &str, attempt: u32) -> String {
    let meta = &pod.metadata;
    format!(
        "k8s_{container}_{}_{}_{}_{attempt}",
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    )
}

/// The engine's configuration for `launch`, with `labels`.
pub fn config(
    launch: &Launch<'_>,
    labels: HashMap<String, String>,
) -> Result<ContainerCreateBody, RuntimeError> {
    let c = launch.container;
    let spec = launch.pod.spec.clone().unwrap_or_default();
    let env = environment(c);
    let env_map: BTreeMap<String, String> = env.iter().cloned().collect();
    let expanded = |items: &Option<Vec<String>>| {
        items
            .as_ref()
            .map(|v| v.iter().map(|s| expand(s, &env_map)).collect::<Vec<_>>())
    };
    let command = expanded(&c.command);
    let args = expanded(&c.args);
    // A `command` replaces the entrypoint and, with no `args`, the image's
    // command too; `args` alone replace the image's command only.
    let (entrypoint, cmd) = match (command, args) {
        (Some(command), args) => (Some(command), Some(args.unwrap_or_default())),
        (None, Some(args)) => (None, Some(args)),
        (None, None) => (None, None),
    };

    let mut exposed = Vec::new();
    let mut bindings = HashMap::new();
    if launch.app {
        for port in c.ports.iter().flatten() {
            let protocol = port
                .protocol
                .as_deref()
                .unwrap_or("TCP")
                .to_ascii_lowercase();
            let key = format!("{}/{protocol}", port.container_port);
            exposed.push(key.clone());
            bindings.insert(
                key,
                Some(vec![PortBinding {
                    host_ip: Some(launch.ip.to_string()),
                    host_port: Some(port.container_port.to_string()),
                }]),
            );
        }
    }

    let limits = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    let nano_cpus = match limits.get("cpu") {
        Some(q) => {
            Some(quantity::nano_cpus(&q.0).map_err(|e| RuntimeError::Config(e.to_string()))?)
        }
        None => None,
    };
    let memory = match limits.get("memory") {
        Some(q) => Some(quantity::bytes(&q.0).map_err(|e| RuntimeError::Config(e.to_string()))?),
        None => None,
    };

    let security = c.security_context.clone().unwrap_or_default();
    let mut security_opt = Vec::new();
    if security.allow_privilege_escalation == Some(false) {
        security_opt.push("no-new-privileges".to_owned());
    }
    let seccomp = security.seccomp_profile.as_ref().or_else(|| {
        spec.security_context
            .as_ref()
            .and_then(|p| p.seccomp_profile.as_ref())
    });
    if seccomp.is_some_and(|p| p.type_ == "Unconfined") {
        security_opt.push("seccomp=unconfined".to_owned());
    }
    let capabilities = security.capabilities.clone().unwrap_or_default();
    let runtime = spec
        .runtime_class_name
        .as_deref()
        .filter(|name| launch.runsc && matches!(*name, "runsc" | "gvisor"))
        .map(|_| RUNSC.to_owned());

    let name = launch.pod.metadata.name.clone().unwrap_or_default();
    Ok(ContainerCreateBody {
        image: Some(c.image.clone().unwrap_or_default()),
        entrypoint,
        cmd,
        env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: c.working_dir.clone(),
        user: user(c, spec.security_context.as_ref()),
        hostname: Some(name.chars().take(63).collect()),
        labels: Some(labels),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        tty: Some(c.tty.unwrap_or(false)),
        open_stdin: Some(false),
        host_config: Some(HostConfig {
            binds: (!launch.binds.is_empty()).then(|| launch.binds.clone()),
            port_bindings: (!bindings.is_empty()).then_some(bindings),
            nano_cpus,
            memory,
            privileged: security.privileged,
            readonly_rootfs: security.read_only_root_filesystem,
            cap_add: capabilities.add,
            cap_drop: capabilities.drop,
            security_opt: (!security_opt.is_empty()).then_some(security_opt),
            runtime,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The engine's id of `image` (`sha256:…`), or `None` when it lacks it.
pub async fn image_id(
    engine: &Engine,
    image: &str,
) -> Result<Option<(String, String)>, ContainerError> {
    match engine.docker().inspect_image(image).await {
        Ok(found) => Ok(Some((
            found.id.unwrap_or_default(),
            found.config.and_then(|c| c.user).unwrap_or_default(),
        ))),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(None),
        Err(error) => Err(engine_failure(format!("inspect image {image}"))(error)),
    }
}

/// Whether the engine has the `runsc` runtime registered.
pub async fn has_runsc(engine: &Engine) -> bool {
    engine
        .docker()
        .info()
        .await
        .ok()
        .and_then(|info| info.runtimes)
        .is_some_and(|runtimes| runtimes.contains_key(RUNSC))
}

/// Makes (not starts) a container; its engine id.
pub async fn create(engine: &Engine, launch: &Launch<'_>) -> Result<String, RuntimeError> {
    let uid = launch.pod.metadata.uid.clone().unwrap_or_default();
    let mut labels = engine.labels(&uid);
    labels.insert(
        LABEL_POD_NAME.to_owned(),
        launch.pod.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(
        LABEL_POD_NAMESPACE.to_owned(),
        launch.pod.metadata.namespace.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_POD_UID.to_owned(), uid);
    labels.insert(
        LABEL_CONTAINER_NAME.to_owned(),
        launch.container.name.clone(),
    );
    let body = config(launch, labels)?;
    if non_root(
        launch.container,
        launch
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref()),
    ) {
        let image = launch.container.image.clone().unwrap_or_default();
        let image_user = image_id(engine, &image)
            .await?
            .map(|(_, u)| u)
            .unwrap_or_default();
        let effective = body.user.clone().unwrap_or(image_user);
        let uid = effective.split(':').next().unwrap_or_default();
        if uid.is_empty() || uid == "0" || uid == "root" {
            return Err(RuntimeError::Config(
                "container has runAsNonRoot and image will run as root".to_owned(),
            ));
        }
    }
    let name = container_name(launch.pod, &launch.container.name, launch.attempt);
    let options = CreateContainerOptionsBuilder::new().name(&name).build();
    let created = engine
        .docker()
        .create_container(Some(options), body)
        .await
        .map_err(|e| RuntimeError::Create(engine_error(format!("create {name}"), e)))?;
    Ok(created.id)
}

fn engine_error(action: String, source: bollard::errors::Error) -> ContainerError {
    engine_failure(action)(source)
}

/// Starts a made container.
pub async fn start(engine: &Engine, id: &str) -> Result<(), RuntimeError> {
    engine
        .docker()
        .start_container(id, None)
        .await
        .map_err(|e| RuntimeError::Start(engine_error(format!("start {id}"), e)))
}

/// Waits until the container is not running, then reads how it ended.
pub async fn wait(engine: &Engine, id: &str) -> Result<Exit, ContainerError> {
    let options = WaitContainerOptionsBuilder::new()
        .condition("not-running")
        .build();
    // A non-zero exit arrives as an error of the stream; either way the
    // inspection below tells how it ended.
    let _ = engine
        .docker()
        .wait_container(id, Some(options))
        .next()
        .await;
    let inspected = engine
        .docker()
        .inspect_container(id, None)
        .await
        .map_err(engine_failure(format!("inspect {id}")))?;
    let state = inspected.state.unwrap_or_default();
    Ok(Exit {
        code: i32::try_from(state.exit_code.unwrap_or_default()).unwrap_or(i32::MAX),
        oom_killed: state.oom_killed.unwrap_or(false),
        started_at: state.started_at.as_deref().and_then(parse_docker_time),
        finished_at: state.finished_at.as_deref().and_then(parse_docker_time),
    })
}

/// Stops a container: SIGTERM, then SIGKILL after `grace` (the engine's stop).
pub async fn stop(engine: &Engine, id: &str, grace: Duration) -> Result<(), ContainerError> {
    let seconds = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
    let options = StopContainerOptionsBuilder::new().t(seconds).build();
    match engine.docker().stop_container(id, Some(options)).await {
        Ok(())
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 304 | 404,
            ..
        }) => Ok(()),
        Err(error) => Err(engine_failure(format!("stop {id}"))(error)),
    }
}

/// Removes a container, running or not; gone already is fine.
pub async fn remove(engine: &Engine, id: &str) -> Result<(), ContainerError> {
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    match engine.docker().remove_container(id, Some(options)).await {
        Ok(())
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(error) => Err(engine_failure(format!("remove {id}"))(error)),
    }
}

/// A container's output so far (stdout and stderr in order), at most
/// [`MAX_LOG_BYTES`] of its end; `tail` keeps the last lines.
pub async fn logs(engine: &Engine, id: &str, tail: Option<u32>) -> Result<Vec<u8>, ContainerError> {
    let tail = tail.map_or_else(|| "all".to_owned(), |n| n.to_string());
    let options = LogsOptionsBuilder::new()
        .stdout(true)
        .stderr(true)
        .tail(&tail)
        .build();
    let mut stream = engine.docker().logs(id, Some(options));
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(engine_failure(format!("read the logs of {id}")))?;
        out.extend_from_slice(&chunk.into_bytes());
        if out.len() > MAX_LOG_BYTES {
            out.drain(..out.len() - MAX_LOG_BYTES);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Capabilities, ContainerPort, EnvVar, PodSpec, ResourceRequirements, SecurityContext,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn references_expand_as_kubernetes_expands_them() {
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        assert_eq!(expand("x$(A)y", &env), "x1y");
        assert_eq!(expand("$(B)", &env), "$(B)");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("cost $5", &env), "cost $5");
        assert_eq!(expand("$(A", &env), "$(A");
    }

    #[test]
    fn a_spec_maps_onto_the_engine() {
        let container = Container {
            name: "app".into(),
            image: Some("silo-base:latest".into()),
            command: Some(vec!["sh".into(), "-c".into(), "echo $(GREETING)".into()]),
            env: Some(vec![
                EnvVar {
                    name: "GREETING".into(),
                    value: Some("hi".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "TWICE".into(),
                    value: Some("$(GREETING)$(GREETING)".into()),
                    ..Default::default()
                },
            ]),
            ports: Some(vec![ContainerPort {
                container_port: 8080,
                ..Default::default()
            }]),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([
                    ("cpu".into(), Quantity("500m".into())),
                    ("memory".into(), Quantity("64Mi".into())),
                ])),
                ..Default::default()
            }),
            security_context: Some(SecurityContext {
                run_as_user: Some(1000),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container.clone()],
                security_context: Some(PodSecurityContext {
                    run_as_group: Some(2000),
                    ..Default::default()
                }),
                runtime_class_name: Some("gvisor".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let launch = Launch {
            pod: &pod,
            container: &container,
            app: true,
            attempt: 0,
            ip: Ipv4Addr::new(127, 77, 3, 2),
            binds: vec![],
            runsc: true,
        };
        let body = config(&launch, HashMap::new()).unwrap();
        assert_eq!(body.entrypoint.unwrap(), ["sh", "-c", "echo hi"]);
        assert_eq!(body.cmd.unwrap(), Vec::<String>::new());
        assert_eq!(body.env.unwrap(), ["GREETING=hi", "TWICE=hihi"]);
        assert_eq!(body.user.as_deref(), Some("1000:2000"));
        let host = body.host_config.unwrap();
        assert_eq!(host.nano_cpus, Some(500_000_000));
        assert_eq!(host.memory, Some(64 << 20));
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
        assert_eq!(host.cap_drop.unwrap(), ["ALL"]);
        assert_eq!(host.security_opt.unwrap(), ["no-new-privileges"]);
        let binding = &host.port_bindings.unwrap()["8080/tcp"].clone().unwrap()[0];
        assert_eq!(binding.host_ip.as_deref(), Some("127.77.3.2"));
        assert_eq!(binding.host_port.as_deref(), Some("8080"));
        let without_runsc = Launch {
            runsc: false,
            ..launch
        };
        let body = config(&without_runsc, HashMap::new()).unwrap();
        assert_eq!(body.host_config.unwrap().runtime, None);
    }
}
