//! Each pod's life on the engine, one task per pod, as a kubelet runs it:
//!
//! 1. Pending: every image must be on the engine (nothing is pulled: a
//!    missing one leaves its container waiting with `ErrImageNeverPull`,
//!    checked again every [`IMAGE_RECHECK`]); then the volumes are made (a
//!    missing Secret leaves the pod `ContainerCreating`, retried every
//!    [`VOLUME_RETRY`]).
//! 2. Init containers run one after the other to completion, sharing the
//!    volumes. One that fails ends a `Never` pod as `Failed` (`Init:Error`);
//!    under `Always` or `OnFailure` it is run again after a back-off.
//! 3. The app container starts with its ports on the pod's address: phase
//!    `Running`, the container `running`, `started` and `ready` (probes are
//!    not run), conditions `Ready` and `ContainersReady` true.
//! 4. When PID 1 exits: `Never` ends the pod `Succeeded` (exit 0) or
//!    `Failed`; `OnFailure` (after a failure) and `Always` run a new
//!    container after a back-off of 10 s doubling to 5 min, counting
//!    `restartCount`, with `lastState` the ended one and the state waiting
//!    `CrashLoopBackOff` meanwhile.
//! 5. Deletion, whenever it comes: the running container gets SIGTERM and,
//!    after the grace period, SIGKILL (the engine's stop); the final
//!    statuses are published, every container and the pod's directory
//!    removed, and the pod leaves the store (a `DELETED` event).
//!
//! Every status change is one update of the pod (a `MODIFIED` event).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Pod, PodSpec, PodStatus,
};
use tokio::sync::watch;

use super::Cluster;
use super::model::{Key, now};
use super::pod_status::{Conditions, initial_status, waiting};
use super::runtime::{self, Exit, Launch, RuntimeError};
use super::store::{Deletion, key_of};
use super::volumes::{self, HostVolume};

/// How often a pod waiting for an image looks again.
pub const IMAGE_RECHECK: Duration = Duration::from_secs(2);
/// How often a pod waiting for a Secret looks again.
pub const VOLUME_RETRY: Duration = Duration::from_secs(1);
/// The first back-off before a container is run again.
pub const BACKOFF_START: Duration = Duration::from_secs(10);
/// The longest back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why a pod's life stopped.
enum Interrupt {
    /// Deletion was asked, with this grace.
    Deleted(Duration),
    /// The mock is stopping.
    Stopped,
}

/// Starts the kubelet task of a new pod.
pub fn start(
    cluster: &Arc<Cluster>,
    pod: Arc<Pod>,
    ip: Ipv4Addr,
    stop: watch::Receiver<Option<Deletion>>,
) {
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut kubelet = Kubelet {
        cluster: cluster.clone(),
        key: key_of(&pod.metadata),
        dir: cluster.pods_dir.join(&uid),
        uid,
        pod,
        ip,
        stop,
        status: initial_status(&spec, ip),
        spec,
        conditions: Conditions::default(),
        image_ids: BTreeMap::new(),
        initialized: false,
        sandbox_ready: false,
        running: None,
        made: Vec::new(),
    };
    kubelet.initialized = kubelet
        .spec
        .init_containers
        .as_ref()
        .is_none_or(Vec::is_empty);
    cluster.spawn_kubelet(kubelet.run());
}

/// Which container of the pod: an init container or the app container, by index.
#[derive(Debug, Clone, Copy)]
struct Slot {
    init: bool,
    index: usize,
}

struct Kubelet {
    cluster: Arc<Cluster>,
    pod: Arc<Pod>,
    spec: PodSpec,
    key: Key,
    uid: String,
    ip: Ipv4Addr,
    dir: PathBuf,
    stop: watch::Receiver<Option<Deletion>>,
    status: PodStatus,
    conditions: Conditions,
    /// Image → engine id.
    image_ids: BTreeMap<String, String>,
    initialized: bool,
    sandbox_ready: bool,
    /// The container running now and its engine id.
    running: Option<(Slot, String)>,
    /// Every container made for the pod.
    made: Vec<String>,
}

impl Kubelet {
    async fn run(mut self) {
        let interrupt = match self.live().await {
            Err(interrupt) => interrupt,
            Ok(never) => match never {},
        };
        if let Interrupt::Deleted(grace) = interrupt {
            let cancel = self.cluster.cancel.clone();
            tokio::select! {
                () = self.terminate(grace) => {}
                () = cancel.cancelled() => {}
            }
        }
        self.cluster.addresses.release(self.ip);
    }

    /// Runs `work` unless deletion is asked or the mock stops first.
    async fn until<T>(&mut self, work: impl Future<Output = T>) -> Result<T, Interrupt> {
        let cancel = self.cluster.cancel.clone();
        tokio::select! {
            value = work => Ok(value),
            asked = self.stop.wait_for(Option::is_some) => Err(match asked {
                Ok(deletion) => Interrupt::Deleted(deletion.map(|d| d.grace).unwrap_or_default()),
                Err(_) => Interrupt::Stopped,
            }),
            () = cancel.cancelled() => Err(Interrupt::Stopped),
        }
    }

    /// Waits for deletion (a pod that has ended, or cannot go on).
    async fn idle(&mut self) -> Result<Infallible, Interrupt> {
        let never = self.until(std::future::pending::<Infallible>()).await?;
        match never {}
    }

    fn slot(&mut self, slot: Slot) -> Option<&mut ContainerStatus> {
        let list = if slot.init {
            self.status.init_container_statuses.as_mut()
        } else {
            self.status.container_statuses.as_mut()
        };
        list.and_then(|l| l.get_mut(slot.index))
    }

    fn container(&self, slot: Slot) -> Option<Container> {
        if slot.init {
            self.spec.init_containers.as_ref()?.get(slot.index).cloned()
        } else {
            self.spec.containers.get(slot.index).cloned()
        }
    }

    fn slots(&self) -> Vec<Slot> {
        let inits = self.spec.init_containers.as_ref().map_or(0, Vec::len);
        (0..inits)
            .map(|index| Slot { init: true, index })
            .chain((0..self.spec.containers.len()).map(|index| Slot { init: false, index }))
            .collect()
    }

    /// Publishes the local status as the pod's (one `MODIFIED` event if it changed).
    fn publish(&mut self) {
        let ended = matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let unready: Vec<String> = self
            .status
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| !c.ready)
            .map(|c| c.name.clone())
            .collect();
        let incomplete: Vec<String> = self
            .status
            .init_container_statuses
            .iter()
            .flatten()
            .filter(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_none_or(|t| t.exit_code != 0)
            })
            .map(|c| c.name.clone())
            .collect();
        let ready_why = if ended {
            ("PodCompleted", String::new())
        } else {
            (
                "ContainersNotReady",
                format!("containers with unready status: [{}]", unready.join(" ")),
            )
        };
        let conditions = vec![
            self.conditions
                .set("PodReadyToStartContainers", self.sandbox_ready, None),
            self.conditions.set(
                "Initialized",
                self.initialized,
                Some((
                    "ContainersNotInitialized",
                    format!(
                        "containers with incomplete status: [{}]",
                        incomplete.join(" ")
                    ),
                )),
            ),
            self.conditions.set(
                "Ready",
                unready.is_empty(),
                Some((ready_why.0, ready_why.1.clone())),
            ),
            self.conditions
                .set("ContainersReady", unready.is_empty(), Some(ready_why)),
            self.conditions.set("PodScheduled", true, None),
        ];
        self.status.conditions = Some(conditions);
        let status = self.status.clone();
        self.cluster
            .store
            .update_pod(&self.key, &self.uid, |pod| pod.status = Some(status));
    }

    async fn live(&mut self) -> Result<Infallible, Interrupt> {
        self.publish();
        self.await_images().await?;
        let volumes = self.await_volumes().await?;
        self.sandbox_ready = true;
        self.publish();
        let restart = self
            .spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".to_owned());
        let inits = self.spec.init_containers.as_ref().map_or(0, Vec::len);
        for index in 0..inits {
            let slot = Slot { init: true, index };
            let mut backoff = BACKOFF_START;
            let mut attempt = 0;
            loop {
                let exit = match self.run_container(slot, attempt, &volumes).await? {
                    Ok(exit) => exit,
                    Err(error) => return self.stuck(slot, &error).await,
                };
                if exit.code == 0 {
                    self.publish();
                    break;
                }
                if restart == "Never" {
                    self.status.phase = Some("Failed".to_owned());
                    self.publish();
                    return self.idle().await;
                }
                self.back_off(slot, backoff).await?;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                attempt += 1;
            }
        }
        self.initialized = true;
        self.publish();
        let slot = Slot {
            init: false,
            index: 0,
        };
        let mut backoff = BACKOFF_START;
        let mut attempt = 0;
        loop {
            let exit = match self.run_container(slot, attempt, &volumes).await? {
                Ok(exit) => exit,
                Err(error) => return self.stuck(slot, &error).await,
            };
            let again = match restart.as_str() {
                "Always" => true,
                "OnFailure" => exit.code != 0,
                _ => false,
            };
            if !again {
                let phase = if exit.code == 0 {
                    "Succeeded"
                } else {
                    "Failed"
                };
                self.status.phase = Some(phase.to_owned());
                self.publish();
                return self.idle().await;
            }
            self.back_off(slot, backoff).await?;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            attempt += 1;
        }
    }

    /// A container that cannot be made or started: it waits with the
    /// kubelet's reason, and the pod waits for deletion.
    async fn stuck(&mut self, slot: Slot, error: &RuntimeError) -> Result<Infallible, Interrupt> {
        tracing::debug!(pod = %self.key.name, %error, "a container could not run");
        if let Some(status) = self.slot(slot) {
            status.state = Some(waiting(error.reason(), Some(error.to_string())));
        }
        self.publish();
        self.idle().await
    }

    /// Waits before running an ended container again, showing `CrashLoopBackOff`.
    async fn back_off(&mut self, slot: Slot, backoff: Duration) -> Result<(), Interrupt> {
        let message = format!(
            "back-off {}s restarting failed container={} pod={}_{}({})",
            backoff.as_secs(),
            self.container(slot).map(|c| c.name).unwrap_or_default(),
            self.key.name,
            self.key.namespace,
            self.uid
        );
        if let Some(status) = self.slot(slot) {
            status.last_state = status.state.take();
            status.restart_count += 1;
            status.state = Some(waiting("CrashLoopBackOff", Some(message)));
        }
        self.publish();
        self.until(tokio::time::sleep(backoff)).await
    }

    async fn await_images(&mut self) -> Result<(), Interrupt> {
        loop {
            let mut missing = Vec::new();
            for slot in self.slots() {
                let image = self
                    .container(slot)
                    .and_then(|c| c.image)
                    .unwrap_or_default();
                if self.image_ids.contains_key(&image) {
                    continue;
                }
                let engine = self.cluster.engine.clone();
                let lookup = image.clone();
                match self
                    .until(async move { runtime::image_id(&engine, &lookup).await })
                    .await?
                {
                    Ok(Some((id, _))) => {
                        self.image_ids.insert(image, id);
                    }
                    Ok(None) => missing.push((slot, image, None)),
                    Err(error) => missing.push((slot, image, Some(error.to_string()))),
                }
            }
            if missing.is_empty() {
                for slot in self.slots() {
                    let initial = if slot.init || !self.initialized {
                        "PodInitializing"
                    } else {
                        "ContainerCreating"
                    };
                    if let Some(status) = self.slot(slot) {
                        status.state = Some(waiting(initial, None));
                    }
                }
                return Ok(());
            }
            for (slot, image, error) in missing {
                let message = error.unwrap_or_else(|| {
                    format!("Container image {image:?} is not present with pull policy of Never")
                });
                if let Some(status) = self.slot(slot) {
                    status.state = Some(waiting("ErrImageNeverPull", Some(message)));
                }
            }
            self.publish();
            self.until(tokio::time::sleep(IMAGE_RECHECK)).await?;
        }
    }

    async fn await_volumes(&mut self) -> Result<BTreeMap<String, HostVolume>, Interrupt> {
        let declared = self.spec.volumes.clone().unwrap_or_default();
        loop {
            match volumes::prepare(
                &self.cluster.store,
                &self.key.namespace,
                &self.dir,
                &declared,
            ) {
                Ok(made) => return Ok(made),
                Err(error) => {
                    let message = format!("MountVolume.SetUp failed: {error}");
                    for slot in self.slots() {
                        if let Some(status) = self.slot(slot) {
                            status.state =
                                Some(waiting("ContainerCreating", Some(message.clone())));
                        }
                    }
                    self.publish();
                    self.until(tokio::time::sleep(VOLUME_RETRY)).await?;
                }
            }
        }
    }

    /// Makes, starts and waits for one container.
    async fn run_container(
        &mut self,
        slot: Slot,
        attempt: u32,
        volumes: &BTreeMap<String, HostVolume>,
    ) -> Result<Result<Exit, RuntimeError>, Interrupt> {
        let Some(container) = self.container(slot) else {
            return Ok(Err(RuntimeError::Config("no such container".to_owned())));
        };
        let binds = match volumes::binds(&container, volumes) {
            Ok(binds) => binds,
            Err(error) => return Ok(Err(RuntimeError::Config(error.to_string()))),
        };
        let pod = self.pod.clone();
        let engine = self.cluster.engine.clone();
        let runsc = self.cluster.runsc;
        let ip = self.ip;
        // Not interruptible: a create cut short may still happen on the
        // engine after the mock's final sweep, leaving a container behind.
        let launch = Launch {
            pod: &pod,
            container: &container,
            app: !slot.init,
            attempt,
            ip,
            binds,
            runsc,
        };
        let created = runtime::create(&engine, &launch).await;
        let id = match created {
            Ok(id) => id,
            Err(error) => return Ok(Err(error)),
        };
        self.made.push(id.clone());
        self.cluster.store.add_container(&self.key, &self.uid, &id);
        let engine = self.cluster.engine.clone();
        let started = {
            let id = id.clone();
            self.until(async move { runtime::start(&engine, &id).await })
                .await?
        };
        if let Err(error) = started {
            return Ok(Err(error));
        }
        self.running = Some((slot, id.clone()));
        let image_id = self
            .image_ids
            .get(container.image.as_deref().unwrap_or_default())
            .map(|i| format!("docker://{i}"))
            .unwrap_or_default();
        if let Some(status) = self.slot(slot) {
            status.container_id = Some(format!("docker://{id}"));
            status.image_id = image_id;
            status.started = Some(true);
            status.ready = !slot.init;
            status.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(now()),
                }),
                ..Default::default()
            });
        }
        if !slot.init {
            self.status.phase = Some("Running".to_owned());
        }
        self.publish();
        let engine = self.cluster.engine.clone();
        let waited = {
            let id = id.clone();
            self.until(async move { runtime::wait(&engine, &id).await })
                .await?
        };
        self.running = None;
        let exit = match waited {
            Ok(exit) => exit,
            Err(error) => return Ok(Err(RuntimeError::Engine(error))),
        };
        self.ended(slot, &id, &exit);
        Ok(Ok(exit))
    }

    /// Records how a container ended.
    fn ended(&mut self, slot: Slot, id: &str, exit: &Exit) {
        let reason = if exit.oom_killed {
            "OOMKilled"
        } else if exit.code == 0 {
            "Completed"
        } else {
            "Error"
        };
        if let Some(status) = self.slot(slot) {
            status.ready = false;
            status.started = Some(false);
            status.state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: Some(format!("docker://{id}")),
                    exit_code: exit.code,
                    reason: Some(reason.to_owned()),
                    started_at: exit.started_at.clone(),
                    finished_at: exit.finished_at.clone().or_else(|| Some(now())),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }

    /// Stops what runs, publishes the end, removes the containers and the pod.
    async fn terminate(&mut self, grace: Duration) {
        let engine = self.cluster.engine.clone();
        if let Some((slot, id)) = self.running.take() {
            if let Err(error) = runtime::stop(&engine, &id, grace).await {
                tracing::warn!(%error, "stopping a pod's container failed");
            }
            let exit = runtime::wait(&engine, &id).await.unwrap_or(Exit {
                code: 137,
                ..Default::default()
            });
            self.ended(slot, &id, &exit);
            if !slot.init {
                let phase = if exit.code == 0 {
                    "Succeeded"
                } else {
                    "Failed"
                };
                self.status.phase = Some(phase.to_owned());
            }
        }
        for status in self.status.container_statuses.iter_mut().flatten() {
            status.ready = false;
        }
        self.publish();
        for id in &self.made {
            if let Err(error) = runtime::remove(&engine, id).await {
                tracing::warn!(%error, "removing a pod's container failed");
            }
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(%error, "removing a pod's directory failed"),
        }
        self.cluster.store.remove_pod(&self.key, &self.uid);
    }
}
