//! [`RemoteBackend`]: the one backend of every provider whose machines are
//! VMs behind a REST API (E2B, Daytona), generic over [`Provider`], the
//! provider's API mapping.
//!
//! What is the same on every provider lives here once: the labels that mark
//! a machine as this home's and this sandbox's, killing what a failed create
//! left before the next one, uploading the agent and its key and starting
//! it, waiting for it through the provider's proxy, a start that brings a
//! stopped agent back, and the orphan sweep. A provider says only how its
//! API makes, finds, pauses, resumes and deletes a machine, how it writes a
//! file and starts a process in one, and how its proxy reaches a port.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::RemoteError;
use super::{
    AGENT_PATH, KEY_PATH, SILO_DIR, access_refused, healthy, probe, sweep, wait_for_agent,
};
use crate::agent_binary::AgentLocator;
use crate::backend::labels::{LABEL_HOME, LABEL_SANDBOX_ID, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH};
use crate::backend::{
    AgentLayers, Backend, BackendError, BackendSetup, LastExit, Machine, MachineStarted,
    MachineState, NoMemoryFork, PortUrl, SnapshotWay,
};
use crate::client::{AgentClient, Endpoint};
use crate::home::HomeId;
use crate::spec::{BackendKind, SandboxSpec};

/// Where a provider's machine is, as its API says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// Up (its agent may still not answer).
    Running,
    /// Paused or stopped.
    Stopped,
}

/// What a resume found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// The machine was up already.
    AlreadyUp,
    /// A pause was resumed: memory and processes (the agent's among them)
    /// are back as they were.
    Resumed,
    /// A stopped machine was started: its processes had ended.
    Restarted,
}

/// A provider's API mapping: everything [`RemoteBackend`] needs to know of
/// one provider. Each method answers the provider's own error, which names
/// the provider and what it answered.
pub trait Provider: std::fmt::Debug + Send + Sync + Sized + 'static {
    /// What silo keeps to find the machine again (its `backend_ref`).
    type Ref: Serialize + DeserializeOwned + std::fmt::Debug + Clone + Send + Sync;
    /// Why one of its operations failed.
    type Error: std::error::Error + Send + Sync + From<RemoteError> + Into<BackendError>;

    /// Which backend this is.
    const KIND: BackendKind;
    /// The provider as people know it, for messages.
    const NAME: &'static str;
    /// Whether the provider can capture a running machine with its memory
    /// for another to start from ([`Provider::capture_memory`]).
    const FORKS_MEMORY: bool = false;
    /// Whether a stopped machine keeps its files; a provider whose stop
    /// deletes the machine (a cluster's pod) says not.
    const STOP_KEEPS_FILES: bool = true;

    /// Whether a stop of the machine `reference` names keeps memory and
    /// processes (a pause), so a start resumes them as they were.
    fn stop_keeps_processes(reference: &Self::Ref) -> bool;

    /// The provider of a home, configured as `setup` says or from the
    /// environment; a bad configuration is told on use, not here.
    fn open(setup: &BackendSetup) -> Self;

    /// The provider's id of the machine `reference` names.
    fn machine_id(reference: &Self::Ref) -> &str;

    /// The error for a machine the provider no longer has.
    fn gone(id: String) -> Self::Error;

    /// Whether the provider can be asked anything (an API key is set); a
    /// sweep of an unconfigured provider finds nothing.
    fn configured(&self) -> bool;

    /// Makes a machine for `machine` carrying `labels`, and answers once it
    /// is up; on failure it leaves nothing it made.
    fn create(
        &self,
        machine: &Machine<'_>,
        labels: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Self::Ref, Self::Error>> + Send;

    /// Where the machine is; `None` when the provider does not know it.
    fn power(&self, id: &str) -> impl Future<Output = Result<Option<Power>, Self::Error>> + Send;

    /// Brings a paused or stopped machine up (updating `reference` with
    /// whatever its start changed); answers what it found.
    fn resume(
        &self,
        reference: &mut Self::Ref,
    ) -> impl Future<Output = Result<Woke, Self::Error>> + Send;

    /// Pauses or stops the machine; answers whether it was up. A machine
    /// already gone was not up.
    fn pause(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Deletes the machine; succeeds if it is already gone.
    fn delete(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Frees what the machine held besides itself once it is deleted (the
    /// memory capture it was made from); succeeds if that is gone.
    fn release(
        &self,
        reference: &Self::Ref,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = reference;
        async { Ok(()) }
    }

    /// Captures the running machine `reference` names, memory and
    /// processes with its files, as `name`; answers what a create takes as
    /// its image. Only a provider with [`Provider::FORKS_MEMORY`] is asked.
    fn capture_memory(
        &self,
        reference: &Self::Ref,
        name: &str,
    ) -> impl Future<Output = Result<String, Self::Error>> + Send {
        let _ = (reference, name);
        async {
            Err(RemoteError::NoMemoryCapture {
                provider: Self::NAME,
            }
            .into())
        }
    }

    /// Deletes the capture `image` ([`Provider::capture_memory`]'s answer);
    /// succeeds if it is already gone.
    fn drop_capture(&self, image: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = image;
        async { Ok(()) }
    }

    /// Replaces the outbound rules of the machine `reference` names with
    /// those of `spec` (its `network`, `allow_out` and `deny_out`), in
    /// place.
    fn set_egress(
        &self,
        reference: &Self::Ref,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// This home's machines carrying every label of `labels`, each with the
    /// silo sandbox id it is labelled with; `sweeping` gives up sooner on a
    /// provider that keeps saying "later".
    fn find(
        &self,
        labels: &BTreeMap<String, String>,
        sweeping: bool,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, Self::Error>> + Send;

    /// Writes `bytes` to `path` in the machine.
    fn upload(
        &self,
        reference: &Self::Ref,
        path: &str,
        bytes: Vec<u8>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Starts the agent in the background (its binary and key in place):
    /// made executable, since uploads are not, by the process that then
    /// becomes it.
    fn start_agent_process(
        &self,
        reference: &Self::Ref,
        machine: &Machine<'_>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Fetches new credentials for the proxy into `reference` when the
    /// provider hands out ones that lapse (a preview token); answers
    /// whether it did. Providers whose access does not lapse keep the
    /// default.
    fn refresh_access(
        &self,
        reference: &mut Self::Ref,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let _ = reference;
        async { Ok(false) }
    }

    /// Where the agent's port is reached, through the provider's proxy.
    fn agent_endpoint(&self, reference: &Self::Ref) -> Result<Endpoint, Self::Error>;

    /// Where `port` of the machine is reached through the provider's proxy,
    /// with the access headers a client must send.
    fn port_url(
        &self,
        reference: &Self::Ref,
        port: u16,
    ) -> impl Future<Output = Result<PortUrl, Self::Error>> + Send;

    /// Puts the agent in a fresh machine and starts it. A provider that can
    /// start a template's own agent (`silo image bake`) overrides this; the
    /// rest upload this build's.
    fn install(
        backend: &RemoteBackend<Self>,
        reference: &Self::Ref,
        machine: &Machine<'_>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        backend.upload_and_start(reference, machine)
    }
}

/// The backend of one provider.
#[derive(Debug)]
pub struct RemoteBackend<P: Provider> {
    inner: Arc<Inner<P>>,
}

impl<P: Provider> Clone for RemoteBackend<P> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<P> {
    provider: P,
    agent: Arc<AgentLocator>,
    home_id: HomeId,
}

impl<P: Provider> RemoteBackend<P> {
    /// The backend of a home.
    pub(crate) fn open(setup: &BackendSetup) -> Self {
        Self {
            inner: Arc::new(Inner {
                provider: P::open(setup),
                agent: Arc::clone(&setup.agent),
                home_id: HomeId::of(&setup.home),
            }),
        }
    }

    /// The provider's API mapping.
    pub(crate) fn provider(&self) -> &P {
        &self.inner.provider
    }

    fn home_id(&self) -> Result<String, P::Error> {
        let home_id = &self.inner.home_id;
        home_id.get().map_err(|source| {
            RemoteError::HomeId {
                path: home_id.path().display().to_string(),
                source,
            }
            .into()
        })
    }

    /// The labels that find a sandbox's machines, and only this home's.
    fn owner(&self, machine: &Machine<'_>) -> Result<BTreeMap<String, String>, P::Error> {
        Ok(BTreeMap::from([
            (LABEL_HOME.to_owned(), self.home_id()?),
            (LABEL_SANDBOX_ID.to_owned(), machine.id.to_owned()),
        ]))
    }

    /// A client of the machine's agent.
    pub(crate) fn agent_client(
        &self,
        reference: &P::Ref,
        machine: &Machine<'_>,
    ) -> Result<AgentClient, P::Error> {
        let endpoint = self.provider().agent_endpoint(reference)?;
        Ok(AgentClient::new(endpoint, machine.key.clone()))
    }

    /// This build's agent binary.
    pub(crate) async fn agent_bytes(&self) -> Result<Vec<u8>, P::Error> {
        let agent = self.inner.agent.get().map_err(RemoteError::from)?;
        tokio::fs::read(&agent.path).await.map_err(|source| {
            RemoteError::ReadAgent {
                path: agent.path.display().to_string(),
                source,
            }
            .into()
        })
    }

    /// Uploads this build's agent and the key, starts the agent and waits
    /// for it to answer.
    pub(crate) async fn upload_and_start(
        &self,
        reference: &P::Ref,
        machine: &Machine<'_>,
    ) -> Result<(), P::Error> {
        let bytes = self.agent_bytes().await?;
        tokio::try_join!(
            self.provider().upload(reference, AGENT_PATH, bytes),
            self.hand_over_key(reference, machine),
        )?;
        self.launch(reference, machine).await
    }

    /// Writes the key where the agent takes it from (and deletes it).
    pub(crate) async fn hand_over_key(
        &self,
        reference: &P::Ref,
        machine: &Machine<'_>,
    ) -> Result<(), P::Error> {
        let key = format!("{}\n", machine.key.to_hex());
        self.provider()
            .upload(reference, KEY_PATH, key.into_bytes())
            .await
    }

    /// Starts the agent and waits for it to answer through the proxy.
    pub(crate) async fn launch(
        &self,
        reference: &P::Ref,
        machine: &Machine<'_>,
    ) -> Result<(), P::Error> {
        self.provider()
            .start_agent_process(reference, machine)
            .await?;
        self.wait_for(reference, machine).await
    }

    /// Waits for the agent to answer through the proxy.
    pub(crate) async fn wait_for(
        &self,
        reference: &P::Ref,
        machine: &Machine<'_>,
    ) -> Result<(), P::Error> {
        let client = self.agent_client(reference, machine)?;
        wait_for_agent(&client).await.map_err(|why| {
            RemoteError::AgentNotReady {
                provider: P::NAME,
                id: P::machine_id(reference).to_owned(),
                why,
            }
            .into()
        })
    }

    /// Whether the agent answers through the proxy; a refused access token
    /// is refreshed once (updating `reference`), and refused again is an
    /// error that says so.
    async fn answering(
        &self,
        reference: &mut P::Ref,
        machine: &Machine<'_>,
    ) -> Result<bool, P::Error> {
        let error = match probe(&self.agent_client(reference, machine)?).await {
            Ok(()) => return Ok(true),
            Err(error) => error,
        };
        if access_refused(&error).is_none() || !self.provider().refresh_access(reference).await? {
            return Ok(false);
        }
        match probe(&self.agent_client(reference, machine)?).await {
            Ok(()) => Ok(true),
            Err(error) => match access_refused(&error) {
                Some(status) => Err(RemoteError::AccessLapsed {
                    provider: P::NAME,
                    id: P::machine_id(reference).to_owned(),
                    status,
                }
                .into()),
                None => Ok(false),
            },
        }
    }

    /// Deletes every machine of this home carrying the sandbox's id.
    async fn delete_leftovers(&self, machine: &Machine<'_>) -> Result<(), P::Error> {
        for (left, _) in self.provider().find(&self.owner(machine)?, false).await? {
            tracing::info!(
                sandbox = machine.name,
                backend = %P::KIND,
                vm = left,
                "deleting a machine a failed create left"
            );
            self.provider().delete(&left).await?;
        }
        Ok(())
    }

    /// Deletes this home's machines whose sandbox is not in `live` (made
    /// by a create that died before recording it, or left by a removal
    /// that did not reach the provider); answers what it deleted (or
    /// would, on a dry run). Without an API key there is nothing to sweep.
    async fn sweep(&self, live: &HashSet<String>, dry_run: bool) -> Result<Vec<String>, P::Error> {
        if !self.provider().configured() {
            return Ok(Vec::new());
        }
        let mine = BTreeMap::from([(LABEL_HOME.to_owned(), self.home_id()?)]);
        let found = self.provider().find(&mine, true).await?;
        sweep(P::KIND.as_str(), found, live, dry_run, |vm| async move {
            self.provider().delete(&vm).await
        })
        .await
    }
}

/// The reference a machine was recorded with, when it names one.
fn parse_ref<P: Provider>(machine: &Machine<'_>) -> Option<P::Ref> {
    serde_json::from_value::<P::Ref>(machine.backend_ref.clone())
        .ok()
        .filter(|r| !P::machine_id(r).is_empty())
}

impl<P: Provider> Backend for RemoteBackend<P> {
    fn kind(&self) -> BackendKind {
        P::KIND
    }

    fn snapshots(&self) -> Option<SnapshotWay> {
        Some(SnapshotWay::AgentLayers(AgentLayers {
            exclude: vec![SILO_DIR.to_owned()],
        }))
    }

    fn stop_keeps_processes(&self, machine: &Machine<'_>) -> bool {
        parse_ref::<P>(machine).is_some_and(|reference| P::stop_keeps_processes(&reference))
    }

    fn forks_memory(&self) -> bool {
        P::FORKS_MEMORY
    }

    fn stop_keeps_files(&self) -> bool {
        P::STOP_KEEPS_FILES
    }

    async fn capture_memory(
        &self,
        source: Machine<'_>,
        name: &str,
    ) -> Result<String, BackendError> {
        if !P::FORKS_MEMORY {
            return Err(NoMemoryFork {
                name: source.name.to_owned(),
                backend: P::KIND,
            }
            .into());
        }
        let reference =
            parse_ref::<P>(&source).ok_or_else(|| P::gone(source.name.to_owned()).into())?;
        self.provider()
            .capture_memory(&reference, name)
            .await
            .map_err(Into::into)
    }

    async fn set_egress(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        let reference =
            parse_ref::<P>(&machine).ok_or_else(|| P::gone(machine.name.to_owned()).into())?;
        self.provider()
            .set_egress(&reference, machine.spec)
            .await
            .map_err(Into::into)
    }

    async fn drop_capture(&self, image: &str) -> Result<(), BackendError> {
        self.provider()
            .drop_capture(image)
            .await
            .map_err(Into::into)
    }

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        self.delete_leftovers(&machine).await.map_err(Into::into)?;
        let mut labels = self.owner(&machine).map_err(Into::into)?;
        labels.insert(LABEL_SANDBOX_NAME.to_owned(), machine.name.to_owned());
        labels.insert(LABEL_SPEC_HASH.to_owned(), machine.spec.hash());
        let reference = self
            .provider()
            .create(&machine, labels)
            .await
            .map_err(Into::into)?;
        if let Err(error) = P::install(self, &reference, &machine).await {
            let id = P::machine_id(&reference);
            if let Err(delete) = self.provider().delete(id).await {
                tracing::warn!(backend = %P::KIND, vm = id, "deleting a half-made machine: {delete}");
            }
            if let Err(release) = self.provider().release(&reference).await {
                tracing::warn!(backend = %P::KIND, vm = id, "freeing what a half-made machine held: {release}");
            }
            return Err(error.into());
        }
        Ok(serde_json::to_value(&reference).unwrap_or_default())
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        let Some(reference) = parse_ref::<P>(&machine) else {
            return Ok(MachineState::Missing);
        };
        let power = self
            .provider()
            .power(P::machine_id(&reference))
            .await
            .map_err(Into::into)?;
        match power {
            None => Ok(MachineState::Missing),
            Some(Power::Stopped) => Ok(MachineState::Stopped),
            Some(Power::Running) => {
                let client = self
                    .agent_client(&reference, &machine)
                    .map_err(Into::into)?;
                Ok(if healthy(&client).await {
                    MachineState::Running
                } else {
                    MachineState::Stopped
                })
            }
        }
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        let Some(mut reference) = parse_ref::<P>(&machine) else {
            return Err(P::gone(machine.name.to_owned()).into());
        };
        let woke = self
            .provider()
            .resume(&mut reference)
            .await
            .map_err(Into::into)?;
        let answering = match woke {
            // A resumed pause brings the agent back as it was.
            Woke::Resumed => {
                let client = self
                    .agent_client(&reference, &machine)
                    .map_err(Into::into)?;
                wait_for_agent(&client).await.is_ok()
            }
            // A stop ended it.
            Woke::Restarted => false,
            Woke::AlreadyUp => self
                .answering(&mut reference, &machine)
                .await
                .map_err(Into::into)?,
        };
        if !answering {
            // The machine runs but the agent does not (a stop ended it, or
            // it left on its idle timeout): its binary is still there.
            self.hand_over_key(&reference, &machine)
                .await
                .map_err(Into::into)?;
            self.launch(&reference, &machine)
                .await
                .map_err(Into::into)?;
        }
        Ok(MachineStarted {
            backend_ref: serde_json::to_value(&reference).unwrap_or_default(),
            was_running: woke == Woke::AlreadyUp && answering,
        })
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        let Some(reference) = parse_ref::<P>(&machine) else {
            return Ok(false);
        };
        self.provider()
            .pause(P::machine_id(&reference))
            .await
            .map_err(Into::into)
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        if let Some(reference) = parse_ref::<P>(&machine) {
            self.provider()
                .delete(P::machine_id(&reference))
                .await
                .map_err(Into::into)?;
            self.provider()
                .release(&reference)
                .await
                .map_err(Into::into)?;
        }
        self.delete_leftovers(&machine).await.map_err(Into::into)
    }

    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        let reference =
            parse_ref::<P>(&machine).ok_or_else(|| P::gone(machine.name.to_owned()).into())?;
        self.provider()
            .agent_endpoint(&reference)
            .map_err(Into::into)
    }

    async fn port_url(&self, machine: Machine<'_>, port: u16) -> Result<PortUrl, BackendError> {
        let reference =
            parse_ref::<P>(&machine).ok_or_else(|| P::gone(machine.name.to_owned()).into())?;
        self.provider()
            .port_url(&reference, port)
            .await
            .map_err(Into::into)
    }

    async fn last_exit(&self, _machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        // A provider's pause or stop does not tell how the agent ended; a
        // start starts it again either way.
        Ok(None)
    }

    async fn sweep_orphans(
        &self,
        live: &HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, BackendError> {
        self.sweep(live, dry_run).await.map_err(Into::into)
    }
}
