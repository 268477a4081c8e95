//! The Kubernetes backend: one pod per silo sandbox, silo's agent its PID 1,
//! on the remote layer's provider seam.
//!
//! - **Create** writes the sandbox's Secret (its key, mounted read-only
//!   into the pod), the NetworkPolicy when one is asked for or the sandbox
//!   has no network, then the pod ([`pod`] maps the spec onto it), and waits
//!   for it to run and its agent to answer. Every object is named alike
//!   (`silo-{sandbox id}-{random}`), labelled with this home and sandbox
//!   (and `app.kubernetes.io/managed-by=silo`), and a create that fails
//!   deletes what it made.
//! - **Reaching the agent**: at the pod's address when silo runs in the
//!   cluster, else through the API server's port-forward ([`forward`]);
//!   [`config::Reach`] says which, `silo doctor` shows it. Every request is
//!   signed with the sandbox's key either way.
//! - **Stop**: a pod cannot stop. Its files are snapshotted first (by the
//!   caller: [`crate::backend::Backend::stop_keeps_files`] is false), then
//!   the pod is deleted and its Secret marked stopped; **start** makes a
//!   new pod from that snapshot.
//! - **Remove** deletes the pod, the Secret and the policy; gc sweeps any of
//!   them whose sandbox silo no longer has.
//!
//! The cluster's client is configured the way every Kubernetes client is
//! (`KUBECONFIG`, `~/.kube/config`, else the pod's service account) and made
//! on first use, so a home without a cluster still opens.

pub mod config;
pub mod error;
pub mod forward;
pub mod pod;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use super::remote::AGENT_PORT;
use super::remote::READY_TIMEOUT;
use super::remote::backend::{Power, Provider, RemoteBackend, Woke};
use super::{BackendSetup, Machine, PortUrl};
use crate::backend::labels::LABEL_SANDBOX_ID;
use crate::client::Endpoint;
use crate::spec::{BackendKind, SandboxSpec};

pub use config::{KubernetesConfig, KubernetesConfigError, Reach};
pub use error::KubernetesError;

/// Runs sandboxes as pods.
pub type KubernetesBackend = RemoteBackend<Kubernetes>;

/// The annotation on a Secret whose pod silo deleted to stop the sandbox.
pub const STOPPED_ANNOTATION: &str = "silo.stopped";
/// The grace a stop gives the agent: the least that is not a forced
/// delete (its files are in the stop's snapshot already).
const STOP_GRACE_SECS: u32 = 1;
/// Pause between looks at a pod that is starting.
const POLL: Duration = Duration::from_millis(25);

/// Kubernetes's mapping onto the provider seam.
#[derive(Debug)]
pub struct Kubernetes {
    /// Read once from the environment; an error is told on use.
    config: Result<KubernetesConfig, KubernetesConfigError>,
    /// How agents are reached, decided on first use and kept (auto looks
    /// at the process's environment and files).
    reach: std::sync::OnceLock<Reach>,
    cluster: Arc<Cluster>,
    forwards: forward::Forwards,
}

/// The cluster's client, made on first use.
#[derive(Default)]
pub struct Cluster {
    client: tokio::sync::OnceCell<(kube::Client, String)>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("connected", &self.client.initialized())
            .finish()
    }
}

impl Cluster {
    async fn connect(&self) -> Result<&(kube::Client, String), KubernetesError> {
        self.client
            .get_or_try_init(|| async {
                let config = kube::Config::infer()
                    .await
                    .map_err(|e| KubernetesError::NoCluster(e.to_string()))?;
                let namespace = config.default_namespace.clone();
                let client = kube::Client::try_from(config)
                    .map_err(|e| KubernetesError::api("make a client", e))?;
                Ok((client, namespace))
            })
            .await
    }

    /// The client.
    pub async fn client(&self) -> Result<kube::Client, KubernetesError> {
        Ok(self.connect().await?.0.clone())
    }

    /// The namespace of the client configuration's context.
    async fn default_namespace(&self) -> Result<String, KubernetesError> {
        Ok(self.connect().await?.1.clone())
    }
}

/// What `silo doctor` says of the cluster: that its API server answers
/// (and its version), the namespace sandboxes go in, and how their agents
/// are reached.
pub async fn survey() -> Result<String, KubernetesError> {
    let config = KubernetesConfig::from_env()?;
    let cluster = Cluster::default();
    let client = cluster.client().await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| KubernetesError::api("read the API server's version", e))?;
    let namespace = match config.namespace.clone() {
        Some(namespace) => namespace,
        None => cluster.default_namespace().await?,
    };
    Ok(format!(
        "{} answers; namespace {namespace}; agents reached by {}",
        version.git_version,
        config.reach().as_str()
    ))
}

/// A pod (and its Secret and policy, named alike) in its namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodName {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl PodName {
    /// The pod of a machine id (`namespace/name`).
    pub fn parse(id: &str) -> Result<Self, KubernetesError> {
        match id.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(Self {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            _ => Err(KubernetesError::Gone(id.to_owned())),
        }
    }
}

impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What silo keeps to find its pod again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesRef {
    /// `namespace/name` of the pod, its Secret and its policy.
    pub pod: String,
    /// The pod's address, once it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
}

impl Kubernetes {
    fn config(&self) -> Result<&KubernetesConfig, KubernetesError> {
        self.config.as_ref().map_err(|e| e.clone().into())
    }

    /// How this process reaches agents (for `silo doctor` too).
    pub fn reach(&self) -> Result<Reach, KubernetesError> {
        let config = self.config()?;
        Ok(*self.reach.get_or_init(|| config.reach()))
    }

    /// The namespace new pods go in.
    async fn namespace(&self) -> Result<String, KubernetesError> {
        match &self.config()?.namespace {
            Some(namespace) => Ok(namespace.clone()),
            None => self.cluster.default_namespace().await,
        }
    }

    async fn api<K>(&self, namespace: &str) -> Result<Api<K>, KubernetesError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Ok(Api::namespaced(self.cluster.client().await?, namespace))
    }

    /// Deletes one object, answering whether it was there.
    async fn delete_object<K>(
        &self,
        pod: &PodName,
        kind: &str,
        grace: u32,
    ) -> Result<bool, KubernetesError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(&pod.namespace).await?;
        let params = DeleteParams {
            grace_period_seconds: Some(grace),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
            Err(error) => Err(KubernetesError::api(format!("delete {kind} {pod}"), error)),
        }
    }

    /// Deletes whatever `create` made of `objects` after failing.
    async fn undo(&self, pod: &PodName) {
        if let Err(error) = self.delete(&pod.to_string()).await {
            tracing::warn!(%pod, "deleting a half-made pod's objects: {error}");
        }
    }

    /// The pod, if the API server has it.
    async fn get_pod(&self, pod: &PodName) -> Result<Option<Pod>, KubernetesError> {
        let pods: Api<Pod> = self.api(&pod.namespace).await?;
        pods.get_opt(&pod.name)
            .await
            .map_err(|e| KubernetesError::api(format!("read pod {pod}"), e))
    }

    /// Looks at the pod every [`POLL`] until `look` has its answer, for
    /// [`READY_TIMEOUT`] at most; then `late` makes the error of the last
    /// look's words.
    async fn poll_pod<T>(
        &self,
        pod: &PodName,
        look: impl Fn(Option<Pod>) -> Result<Looked<T>, KubernetesError>,
        late: impl FnOnce(String) -> KubernetesError,
    ) -> Result<T, KubernetesError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let last = match look(self.get_pod(pod).await?)? {
                Looked::Done(answer) => return Ok(answer),
                Looked::Waiting(last) => last,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(late(last));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for the pod to run with an address; the error says what its
    /// status said last.
    async fn wait_running(&self, pod: &PodName) -> Result<String, KubernetesError> {
        let not_started = |why| KubernetesError::NotStarted {
            pod: pod.to_string(),
            why,
        };
        let look = |found: Option<Pod>| {
            let found = found.ok_or_else(|| KubernetesError::Gone(pod.to_string()))?;
            match started(&found) {
                Ok(Some(ip)) => Ok(Looked::Done(ip)),
                Ok(None) => Ok(Looked::Waiting(describe(&found))),
                Err(why) => Err(not_started(why)),
            }
        };
        self.poll_pod(pod, look, |last| {
            not_started(format!("still not running after {READY_TIMEOUT:?}: {last}"))
        })
        .await
    }

    /// Waits for a deleted pod to be gone: until then its container may
    /// still run and answer (and, on a stop, take in what its snapshot
    /// no longer holds).
    async fn wait_gone(&self, pod: &PodName) -> Result<(), KubernetesError> {
        let look = |found: Option<Pod>| {
            Ok(match found {
                None => Looked::Done(()),
                Some(found) => Looked::Waiting(describe(&found)),
            })
        };
        self.poll_pod(pod, look, |why| KubernetesError::NotStopped {
            pod: pod.to_string(),
            why,
        })
        .await
    }

    /// The names of this home's objects of one kind carrying `selector`,
    /// with the sandbox each is labelled with.
    async fn list<K>(
        &self,
        namespace: &str,
        selector: &str,
    ) -> Result<Vec<(String, Option<String>)>, KubernetesError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(namespace).await?;
        let listed = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| {
                KubernetesError::api(format!("list objects in namespace {namespace}"), e)
            })?;
        Ok(listed
            .items
            .into_iter()
            .filter_map(|object| {
                let meta = object.meta();
                let name = meta.name.clone()?;
                let owner = meta
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(LABEL_SANDBOX_ID).cloned());
                Some((format!("{namespace}/{name}"), owner))
            })
            .collect())
    }
}

/// What a look at a pod found.
enum Looked<T> {
    /// What was waited for.
    Done(T),
    /// Not yet: what its status says.
    Waiting(String),
}

/// The pod's address once it runs; `None` while it is on its way; an error
/// once it cannot get there (ended, or its image cannot be had).
fn started(pod: &Pod) -> Result<Option<String>, String> {
    let status = pod.status.clone().unwrap_or_default();
    match status.phase.as_deref() {
        Some("Running") => Ok(status.pod_ip.filter(|ip| !ip.is_empty())),
        Some("Succeeded" | "Failed") => Err(describe(pod)),
        _ => {
            let waiting = status
                .container_statuses
                .iter()
                .chain(status.init_container_statuses.iter())
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .find(|reason| {
                    matches!(
                        reason.as_str(),
                        "ErrImagePull"
                            | "ImagePullBackOff"
                            | "ErrImageNeverPull"
                            | "InvalidImageName"
                            | "CreateContainerConfigError"
                            | "CreateContainerError"
                    )
                });
            match waiting {
                Some(reason) => Err(format!("{reason}: {}", describe(pod))),
                None => Ok(None),
            }
        }
    }
}

/// What a pod's status says, for messages: its phase and each container's
/// state with its reason and message.
fn describe(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let mut parts = vec![format!(
        "phase {}",
        status.phase.as_deref().unwrap_or("unknown")
    )];
    for container in status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
    {
        let Some(state) = &container.state else {
            continue;
        };
        let said = if let Some(waiting) = &state.waiting {
            format!(
                "waiting ({}{})",
                waiting.reason.as_deref().unwrap_or("no reason"),
                waiting
                    .message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )
        } else if let Some(ended) = &state.terminated {
            format!(
                "exited {} ({}{})",
                ended.exit_code,
                ended.reason.as_deref().unwrap_or("no reason"),
                ended
                    .message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )
        } else {
            "running".to_owned()
        };
        parts.push(format!("container {} {said}", container.name));
    }
    parts.join(", ")
}

impl Provider for Kubernetes {
    type Ref = KubernetesRef;
    type Error = KubernetesError;
    const NAME: &'static str = "Kubernetes";
    const KIND: BackendKind = BackendKind::Kubernetes;
    const STOP_KEEPS_FILES: bool = false;

    fn stop_keeps_processes(_: &KubernetesRef) -> bool {
        false
    }

    fn open(setup: &BackendSetup) -> Self {
        Self {
            config: setup
                .kubernetes
                .clone()
                .map_or_else(KubernetesConfig::from_env, Ok),
            reach: std::sync::OnceLock::new(),
            cluster: Arc::default(),
            forwards: forward::Forwards::default(),
        }
    }

    fn machine_id(reference: &KubernetesRef) -> &str {
        &reference.pod
    }

    fn gone(id: String) -> KubernetesError {
        KubernetesError::Gone(id)
    }

    fn configured(&self) -> bool {
        config::cluster_configured()
    }

    async fn create(
        &self,
        machine: &Machine<'_>,
        labels: BTreeMap<String, String>,
    ) -> Result<KubernetesRef, KubernetesError> {
        let config = self.config()?;
        let pod = PodName {
            namespace: self.namespace().await?,
            name: format!("silo-{}-{}", machine.id, suffix()?),
        };
        let image = machine
            .image
            .or(machine.spec.image.as_deref())
            .unwrap_or_default();
        let objects = pod::Plan {
            name: &pod.name,
            spec: machine.spec,
            image,
            labels: pod::selecting(&labels),
            annotations: labels,
            key_hex: machine.key.to_hex(),
            agent_image: config.agent_image.as_deref(),
            admit: config.admit.as_ref().map(|(k, v)| (k.as_str(), v.as_str())),
        }
        .objects();
        let made = async {
            let secrets: Api<Secret> = self.api(&pod.namespace).await?;
            secrets
                .create(&PostParams::default(), &objects.secret)
                .await
                .map_err(|e| KubernetesError::api(format!("create secret {pod}"), e))?;
            if let Some(policy) = &objects.policy {
                let policies: Api<NetworkPolicy> = self.api(&pod.namespace).await?;
                policies
                    .create(&PostParams::default(), policy)
                    .await
                    .map_err(|e| KubernetesError::api(format!("create networkpolicy {pod}"), e))?;
            }
            let pods: Api<Pod> = self.api(&pod.namespace).await?;
            pods.create(&PostParams::default(), &objects.pod)
                .await
                .map_err(|e| KubernetesError::api(format!("create pod {pod}"), e))?;
            self.wait_running(&pod).await
        }
        .await;
        match made {
            Ok(ip) => Ok(KubernetesRef {
                pod: pod.to_string(),
                pod_ip: Some(ip),
            }),
            Err(error) => {
                self.undo(&pod).await;
                Err(error)
            }
        }
    }

    async fn power(&self, id: &str) -> Result<Option<Power>, KubernetesError> {
        let pod = PodName::parse(id)?;
        if let Some(found) = self.get_pod(&pod).await? {
            let running = found.metadata.deletion_timestamp.is_none()
                && found.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            return Ok(Some(if running {
                Power::Running
            } else {
                Power::Stopped
            }));
        }
        // No pod: stopped if silo deleted it to stop the sandbox (its
        // Secret says so), else gone.
        let secrets: Api<Secret> = self.api(&pod.namespace).await?;
        let secret = secrets
            .get_opt(&pod.name)
            .await
            .map_err(|e| KubernetesError::api(format!("read secret {pod}"), e))?;
        let stopped = secret.is_some_and(|secret| {
            secret
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(STOPPED_ANNOTATION))
        });
        Ok(stopped.then_some(Power::Stopped))
    }

    async fn resume(&self, reference: &mut KubernetesRef) -> Result<Woke, KubernetesError> {
        match self.power(&reference.pod).await? {
            Some(Power::Running) => Ok(Woke::AlreadyUp),
            _ => Err(KubernetesError::Unsupported(
                "start again once deleted: it is made anew from the sandbox's latest snapshot",
            )),
        }
    }

    /// Marks the Secret stopped, then deletes the pod (its files were
    /// snapshotted by the caller) and waits for it to be gone, so nothing
    /// reaches its agent after the stop.
    async fn pause(&self, id: &str) -> Result<bool, KubernetesError> {
        let pod = PodName::parse(id)?;
        let was_running = self.power(id).await? == Some(Power::Running);
        let secrets: Api<Secret> = self.api(&pod.namespace).await?;
        let mark = serde_json::json!({
            "metadata": { "annotations": { STOPPED_ANNOTATION: "true" } }
        });
        match secrets
            .patch(&pod.name, &PatchParams::default(), &Patch::Merge(&mark))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(error) => {
                return Err(KubernetesError::api(format!("mark secret {pod}"), error));
            }
        }
        // A grace of 0 is a forced delete: the API forgets the pod at once
        // while its container may run on. One second keeps the pod listed
        // until the kubelet has ended it, which is what is waited for.
        self.delete_object::<Pod>(&pod, "pod", STOP_GRACE_SECS)
            .await?;
        self.wait_gone(&pod).await?;
        Ok(was_running)
    }

    async fn delete(&self, id: &str) -> Result<(), KubernetesError> {
        let pod = PodName::parse(id)?;
        let grace = u32::try_from(pod::GRACE_SECS).unwrap_or(0);
        // Gone once it answers, as `kubectl delete` waits: nothing of the
        // sandbox runs on after `silo rm`.
        if self.delete_object::<Pod>(&pod, "pod", grace).await? {
            self.wait_gone(&pod).await?;
        }
        self.delete_object::<Secret>(&pod, "secret", 0).await?;
        self.delete_object::<NetworkPolicy>(&pod, "networkpolicy", 0)
            .await?;
        Ok(())
    }

    async fn set_egress(
        &self,
        _reference: &KubernetesRef,
        _spec: &SandboxSpec,
    ) -> Result<(), KubernetesError> {
        Err(KubernetesError::Unsupported(
            "change its network after it is made (`silo up --recreate` makes it again)",
        ))
    }

    /// Pods and Secrets (a stopped sandbox has only its Secret), each
    /// object set once.
    async fn find(
        &self,
        labels: &BTreeMap<String, String>,
        _sweeping: bool,
    ) -> Result<Vec<(String, Option<String>)>, KubernetesError> {
        let namespace = self.namespace().await?;
        let selector = pod::selector(labels);
        let mut found = self.list::<Pod>(&namespace, &selector).await?;
        found.extend(self.list::<Secret>(&namespace, &selector).await?);
        found.extend(self.list::<NetworkPolicy>(&namespace, &selector).await?);
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found)
    }

    async fn upload(
        &self,
        _reference: &KubernetesRef,
        _path: &str,
        _bytes: Vec<u8>,
    ) -> Result<(), KubernetesError> {
        Err(KubernetesError::Unsupported(
            "be given files but through its agent",
        ))
    }

    async fn start_agent_process(
        &self,
        _reference: &KubernetesRef,
        _machine: &Machine<'_>,
    ) -> Result<(), KubernetesError> {
        Err(KubernetesError::Unsupported(
            "start its agent again: the agent is its PID 1, and its end is the pod's",
        ))
    }

    fn agent_endpoint(&self, reference: &KubernetesRef) -> Result<Endpoint, KubernetesError> {
        match self.reach()? {
            Reach::PodIp => {
                let host = reference
                    .pod_ip
                    .clone()
                    .ok_or_else(|| KubernetesError::Gone(reference.pod.clone()))?;
                Ok(Endpoint::Tcp {
                    host,
                    port: AGENT_PORT,
                })
            }
            Reach::PortForward => {
                let pod = PodName::parse(&reference.pod)?;
                let port = self.forwards.local_port(&self.cluster, &pod, AGENT_PORT)?;
                Ok(Endpoint::Tcp {
                    host: "127.0.0.1".to_owned(),
                    port,
                })
            }
        }
    }

    async fn port_url(
        &self,
        reference: &KubernetesRef,
        port: u16,
    ) -> Result<PortUrl, KubernetesError> {
        match (self.reach()?, &reference.pod_ip) {
            (Reach::PodIp, Some(ip)) => Ok(PortUrl {
                host: format!("{ip}:{port}"),
                url: format!("http://{ip}:{port}"),
                headers: Vec::new(),
            }),
            _ => Err(KubernetesError::Unsupported(
                "be reached at a port from outside the cluster (run silo in the cluster, \
                 or `kubectl port-forward` the port)",
            )),
        }
    }

    /// The agent is the pod's PID 1 and its key is mounted: nothing to
    /// install, only to wait for.
    async fn install(
        backend: &RemoteBackend<Self>,
        reference: &KubernetesRef,
        machine: &Machine<'_>,
    ) -> Result<(), KubernetesError> {
        backend.wait_for(reference, machine).await
    }
}

/// Five random lowercase letters and digits, so a new pod of a sandbox
/// never waits for the name of one still terminating.
fn suffix() -> Result<String, KubernetesError> {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bytes = [0u8; 5];
    getrandom::fill(&mut bytes).map_err(|_| KubernetesError::NoRandomness)?;
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}
