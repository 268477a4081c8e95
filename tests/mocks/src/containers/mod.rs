//! Sandboxes as Docker containers, the shared half of every mock provider:
//! one container per sandbox, made from a template's image over the Engine
//! API (bollard; never the docker CLI).
//!
//! PID 1 of each container is a small keep-alive shell loop, so whatever a
//! client starts inside (silo's agent, above all) is *not* PID 1, as in a
//! provider's VM. The image therefore needs `/bin/sh` with `sleep`,
//! `mkdir` and `kill` (busybox has all three; `silo-base:latest` is built
//! from it). Container ports are published on 127.0.0.1 only, each on an
//! ephemeral host port; the mocks never connect to a bridge address.
//!
//! Every container carries labels naming the mock kind and the instance
//! that made it, so an instance removes exactly its own (see
//! [`Engine::remove_all`]). A container can be paused (frozen, processes
//! kept) or stopped (every process ends) and started again, and its file
//! system committed to an image (a provider's fork or snapshot) that new
//! sandboxes start from; those images carry the same labels and go with
//! the instance too. Files go in and out as tar archives ([`files`]);
//! processes run as `docker exec` ([`exec`]).

pub mod entries;
pub mod exec;
pub mod files;

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerConfig, ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    ListImagesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
    StopContainerOptionsBuilder,
};

/// Label naming the kind of mock that made a container (`e2b`, ...).
pub const LABEL_MOCK: &str = "silo.mock";
/// Label naming the mock instance that made a container.
pub const LABEL_INSTANCE: &str = "silo.mock.instance";
/// Label naming the sandbox a container backs (on an image: the sandbox
/// it was committed from).
pub const LABEL_SANDBOX: &str = "silo.mock.sandbox";
/// Most passes over an instance's images at removal: an image another was
/// committed on top of goes only after that one.
const IMAGE_REMOVAL_PASSES: usize = 8;

/// PID 1 of every sandbox: makes the directories given as arguments, then
/// sleeps in the background and waits, so it reaps orphans re-parented to
/// it and exits at once on SIGTERM.
const KEEP_ALIVE: &str = "trap 'exit 0' TERM INT; [ $# -eq 0 ] || mkdir -p \"$@\"; \
                          while :; do sleep 3600 & wait $!; done";

/// What went wrong talking to the engine.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// No engine could be reached.
    #[error("connecting to the docker engine failed")]
    Connect(#[source] silo::internals::docker::DockerError),
    /// The engine refused or failed a request.
    #[error("docker could not {action}")]
    Engine {
        /// What was asked, for the message.
        action: String,
        /// bollard's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine answered without something it always sends.
    #[error("docker did not report {what} for container {container}")]
    Missing {
        /// What was missing.
        what: String,
        /// The container.
        container: String,
    },
    /// Building or reading a tar archive failed.
    #[error("the tar archive for {path} is unusable")]
    Archive {
        /// The file in the container.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ContainerError {
    /// The HTTP status of an engine error, if the engine answered.
    pub fn engine_status(&self) -> Option<u16> {
        match self {
            ContainerError::Engine {
                source: bollard::errors::Error::DockerResponseServerError { status_code, .. },
                ..
            } => Some(*status_code),
            _ => None,
        }
    }
}

/// A closure turning a bollard error into [`ContainerError::Engine`].
pub(crate) fn engine(
    action: impl Into<String>,
) -> impl FnOnce(bollard::errors::Error) -> ContainerError {
    let action = action.into();
    move |source| ContainerError::Engine { action, source }
}

/// The engine, seen by one mock instance.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    kind: String,
    instance: String,
}

/// What a new sandbox container is made from.
pub struct ContainerSpec<'a> {
    /// The sandbox id (names the container and labels it).
    pub sandbox_id: &'a str,
    /// The image (must exist on the engine; nothing is pulled).
    pub image: &'a str,
    /// Environment of the container, so of every process in it.
    pub env: Vec<(String, String)>,
    /// Container ports to publish on 127.0.0.1.
    pub ports: &'a [u16],
    /// Directories the keep-alive makes before anything else runs.
    pub dirs: &'a [&'a str],
}

impl Engine {
    /// Connects as silo does (`DOCKER_HOST`, API version negotiation), for a
    /// mock of `kind` whose containers are labelled with `instance`.
    pub async fn connect(kind: &str, instance: &str) -> Result<Self, ContainerError> {
        let docker = silo::internals::docker::connect()
            .await
            .map_err(ContainerError::Connect)?;
        Ok(Self {
            docker,
            kind: kind.to_owned(),
            instance: instance.to_owned(),
        })
    }

    /// Makes and starts a sandbox's container and reads its published ports.
    pub async fn create(&self, spec: &ContainerSpec<'_>) -> Result<Container, ContainerError> {
        let name = format!("silo-mock-{}-{}", self.kind, spec.sandbox_id);
        let bindings = spec
            .ports
            .iter()
            .map(|port| {
                let binding = PortBinding {
                    host_ip: Some(Ipv4Addr::LOCALHOST.to_string()),
                    host_port: Some(String::new()),
                };
                (format!("{port}/tcp"), Some(vec![binding]))
            })
            .collect::<HashMap<_, _>>();
        let labels = self.labels(spec.sandbox_id);
        let mut cmd = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            KEEP_ALIVE.to_owned(),
            "keep-alive".to_owned(),
        ];
        cmd.extend(spec.dirs.iter().map(|d| (*d).to_owned()));
        let body = ContainerCreateBody {
            image: Some(spec.image.to_owned()),
            entrypoint: Some(Vec::new()),
            cmd: Some(cmd),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            exposed_ports: Some(spec.ports.iter().map(|p| format!("{p}/tcp")).collect()),
            hostname: Some(spec.sandbox_id.to_owned()),
            tty: Some(false),
            open_stdin: Some(false),
            host_config: Some(HostConfig {
                port_bindings: Some(bindings),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(engine(format!("create {name} from {}", spec.image)))?;
        let container = Container {
            docker: self.docker.clone(),
            id: created.id,
            ports: BTreeMap::new(),
        };
        if let Err(error) = self.docker.start_container(&container.id, None).await {
            container.remove().await.ok();
            return Err(engine(format!("start {name}"))(error));
        }
        match container.published_ports(spec.ports).await {
            Ok(ports) => Ok(Container { ports, ..container }),
            Err(error) => {
                container.remove().await.ok();
                Err(error)
            }
        }
    }

    /// The labels that mark a container or an image as this instance's,
    /// backing `sandbox_id`: what [`Engine::remove_all`] finds.
    pub fn labels(&self, sandbox_id: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_MOCK.to_owned(), self.kind.clone()),
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_SANDBOX.to_owned(), sandbox_id.to_owned()),
        ])
    }

    /// The engine's client, for a provider whose containers are not
    /// keep-alive sandboxes (a Kubernetes pod runs its own command); what
    /// it makes must carry [`Engine::labels`].
    pub(crate) fn docker(&self) -> &Docker {
        &self.docker
    }

    /// A handle on a running container this instance made without
    /// [`Engine::create`] (a Kubernetes pod's, made by its runtime), so
    /// processes can be started in it; no ports are known.
    pub fn container(&self, id: &str) -> Container {
        Container {
            docker: self.docker.clone(),
            id: id.to_owned(),
            ports: BTreeMap::new(),
        }
    }

    /// Whether the engine has `image` (nothing is pulled).
    pub async fn has_image(&self, image: &str) -> Result<bool, ContainerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(error) => Err(engine(format!("inspect image {image}"))(error)),
        }
    }

    /// Commits `container`'s file system to a new image labelled with
    /// this instance and `sandbox_id` (the engine pauses the container
    /// meanwhile, so the copy is consistent); the image's id. Memory and
    /// processes are not in it: a sandbox made from it starts afresh.
    pub async fn commit(
        &self,
        container: &Container,
        sandbox_id: &str,
    ) -> Result<String, ContainerError> {
        let options = CommitContainerOptionsBuilder::new()
            .container(&container.id)
            .pause(true)
            .build();
        let labels = self.labels(sandbox_id);
        let config = ContainerConfig {
            labels: Some(labels),
            ..Default::default()
        };
        let committed = self
            .docker
            .commit_container(options, config)
            .await
            .map_err(engine(format!("commit {}", container.id)))?;
        Ok(committed.id)
    }

    /// Removes an image this instance committed; gone already is fine.
    pub async fn remove_image(&self, image: &str) -> Result<(), ContainerError> {
        let options = RemoveImageOptionsBuilder::new().build();
        match self.docker.remove_image(image, Some(options), None).await {
            Ok(_)
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(error) => Err(engine(format!("remove image {image}"))(error)),
        }
    }

    /// Removes every container this instance made, then every image it
    /// committed; returns how many containers went.
    pub async fn remove_all(&self) -> Result<usize, ContainerError> {
        let found = labelled(&self.docker, LABEL_INSTANCE, &self.instance).await?;
        for id in &found {
            remove_container(&self.docker, id).await?;
        }
        self.remove_images().await?;
        Ok(found.len())
    }

    /// Removes the images this instance committed, newest first, again
    /// while one that others were committed on top of is left.
    async fn remove_images(&self) -> Result<(), ContainerError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_INSTANCE}={}", self.instance)],
        )]);
        let mut last_error = None;
        for _ in 0..IMAGE_REMOVAL_PASSES {
            let options = ListImagesOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build();
            let mut images = self
                .docker
                .list_images(Some(options))
                .await
                .map_err(engine(format!(
                    "list the images of instance {}",
                    self.instance
                )))?;
            if images.is_empty() {
                return Ok(());
            }
            images.sort_by_key(|image| std::cmp::Reverse(image.created));
            for image in images {
                if let Err(error) = self.remove_image(&image.id).await {
                    last_error = Some(error);
                }
            }
        }
        last_error.map_or(Ok(()), Err)
    }
}

/// One sandbox's container.
#[derive(Clone)]
pub struct Container {
    docker: Docker,
    id: String,
    ports: BTreeMap<u16, SocketAddr>,
}

impl Container {
    /// The engine's id of the container.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where a container port is published on 127.0.0.1, if it is.
    pub fn host_addr(&self, container_port: u16) -> Option<SocketAddr> {
        self.ports.get(&container_port).copied()
    }

    /// Freezes every process (`docker pause`).
    pub async fn pause(&self) -> Result<(), ContainerError> {
        self.docker
            .pause_container(&self.id)
            .await
            .map_err(engine(format!("pause {}", self.id)))
    }

    /// Thaws a paused container.
    pub async fn unpause(&self) -> Result<(), ContainerError> {
        self.docker
            .unpause_container(&self.id)
            .await
            .map_err(engine(format!("unpause {}", self.id)))
    }

    /// Stops the container (`docker stop`): SIGTERM to PID 1, whose exit
    /// ends every other process, and SIGKILL if it is still up after
    /// `grace`. Stopped already is fine.
    pub async fn stop(&self, grace: Duration) -> Result<(), ContainerError> {
        let seconds = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(seconds).build();
        match self.docker.stop_container(&self.id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(error) => Err(engine(format!("stop {}", self.id))(error)),
        }
    }

    /// Starts a stopped container again (PID 1 is the keep-alive anew) and
    /// returns it with its published ports read afresh: the engine picks new
    /// host ports at every start.
    pub async fn start(&self) -> Result<Container, ContainerError> {
        self.docker
            .start_container(&self.id, None)
            .await
            .map_err(engine(format!("start {}", self.id)))?;
        let wanted: Vec<u16> = self.ports.keys().copied().collect();
        let ports = self.published_ports(&wanted).await?;
        Ok(Container {
            ports,
            ..self.clone()
        })
    }

    /// Removes the container, running or paused; gone already is fine.
    pub async fn remove(&self) -> Result<(), ContainerError> {
        remove_container(&self.docker, &self.id).await
    }

    /// Reads the host side of each published port.
    async fn published_ports(
        &self,
        ports: &[u16],
    ) -> Result<BTreeMap<u16, SocketAddr>, ContainerError> {
        let inspected = self
            .docker
            .inspect_container(&self.id, None)
            .await
            .map_err(engine(format!("inspect {}", self.id)))?;
        let map = inspected
            .network_settings
            .and_then(|n| n.ports)
            .unwrap_or_default();
        let mut published = BTreeMap::new();
        for port in ports {
            let missing = || ContainerError::Missing {
                what: format!("the host port of {port}/tcp"),
                container: self.id.clone(),
            };
            let host_port: u16 = map
                .get(&format!("{port}/tcp"))
                .and_then(|b| b.as_ref())
                .into_iter()
                .flatten()
                .filter(|b| b.host_ip.as_deref() == Some("127.0.0.1"))
                .find_map(|b| b.host_port.as_deref()?.parse().ok())
                .ok_or_else(missing)?;
            published.insert(*port, SocketAddr::from((Ipv4Addr::LOCALHOST, host_port)));
        }
        Ok(published)
    }
}

/// Ids of every container (running or not) whose `label` is `value`, e.g.
/// the container of one sandbox: `labelled(docker, LABEL_SANDBOX, id)`.
pub async fn labelled(
    docker: &Docker,
    label: &str,
    value: &str,
) -> Result<Vec<String>, ContainerError> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{label}={value}")])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let found = docker
        .list_containers(Some(options))
        .await
        .map_err(engine(format!("list containers labelled {label}={value}")))?;
    Ok(found.into_iter().filter_map(|c| c.id).collect())
}

async fn remove_container(docker: &Docker, id: &str) -> Result<(), ContainerError> {
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        // A delete answered at once and still removing it in the background
        // (Daytona's) races a shutdown's sweep: either removal will do.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            message,
        }) if message.contains("already in progress") => Ok(()),
        Err(error) => Err(engine(format!("remove {id}"))(error)),
    }
}
