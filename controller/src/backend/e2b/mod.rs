//! The E2B backend: one E2B sandbox (a Firecracker VM from a template) per
//! silo sandbox, with silo's own agent running in it beside E2B's envd.
//!
//! - **Create**: `POST /sandboxes` with auto-pause (so E2B's timeout pauses
//!   rather than kills it) and metadata naming this home and sandbox; then,
//!   through envd on the sandbox proxy, upload the agent and the key and
//!   start the agent in the background (see [`crate::backend::remote`]). A
//!   create that fails half way kills what it made, and the next create of
//!   the same sandbox first kills anything left with its metadata, so no VM
//!   is orphaned.
//! - **Stop** is E2B's pause: memory and processes are kept, and **start**
//!   (`connect`) resumes them as they were. Every start renews the timeout.
//! - **Remove** kills the VM and anything else carrying its metadata.
//! - **Status** asks E2B (`running` / `paused` / unknown) and, when
//!   running, whether the agent answers.
//!
//! The agent is reached through E2B's proxy at `{port}-{id}.{domain}`, with
//! the traffic token when the sandbox has one; every request is still signed
//! with the sandbox's key, which never leaves silo but as a file the agent
//! deletes on start.

pub mod api;
pub mod config;
pub mod envd;
pub mod error;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::labels::{LABEL_HOME, LABEL_SANDBOX_ID, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH};
use super::remote::{
    AGENT_PATH, AGENT_PORT, KEY_PATH, SWEEP_RETRY_BUDGET, agent_command, healthy, sweep,
    wait_for_agent,
};
use super::{
    Backend, BackendError, LastExit, Machine, MachineStarted, MachineState, SnapshotSupport,
};
use crate::agent_binary::AgentLocator;
use crate::client::{AgentClient, Endpoint};
use crate::home::{Home, HomeId};
use crate::image::BAKED_AGENT_PATH;
use crate::spec::BackendKind;

pub use api::Api;
pub use config::{E2bConfig, E2bConfigError};
pub use envd::Envd;
pub use error::E2bError;

/// What came of starting a template's own agent.
enum Baked {
    /// It answers.
    Serving,
    /// The template has none.
    Absent,
    /// It ran and exited.
    Exited,
}

/// The header E2B's proxy wants for ports other than envd's on sandboxes
/// without public traffic.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Runs sandboxes as E2B sandboxes.
#[derive(Debug, Clone)]
pub struct E2bBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    agent: Arc<AgentLocator>,
    /// Read once from the environment; an error is kept and told on use,
    /// so a home without E2B settings still opens.
    config: Result<E2bConfig, E2bConfigError>,
    home_id: HomeId,
}

/// What silo keeps to find its E2B sandbox again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2bRef {
    /// E2B's id of the sandbox.
    pub sandbox_id: String,
    /// The template it was made from.
    pub template: String,
    /// envd's access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_token: Option<String>,
    /// The proxy's traffic token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_token: Option<String>,
    /// The sandbox's domain, when E2B named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

impl E2bRef {
    /// What to keep of a sandbox E2B just made from `template`.
    pub fn new(created: api::SandboxCreated, template: String) -> Self {
        Self {
            sandbox_id: created.sandbox_id,
            template,
            envd_token: created.envd_access_token,
            traffic_token: created.traffic_access_token,
            domain: created.domain.filter(|d| !d.is_empty()),
        }
    }
}

impl E2bBackend {
    /// The E2B backend of a home, with the configuration given or else the
    /// environment's.
    pub(crate) fn open(setup: &super::BackendSetup) -> Self {
        let config = setup.e2b.clone().map_or_else(E2bConfig::from_env, Ok);
        Self::with_config(setup.home.clone(), Arc::clone(&setup.agent), config)
    }

    /// An E2B backend with the configuration given.
    pub fn with_config(
        home: Home,
        agent: Arc<AgentLocator>,
        config: Result<E2bConfig, E2bConfigError>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                home_id: HomeId::of(&home),
                agent,
                config,
            }),
        }
    }

    fn config(&self) -> Result<&E2bConfig, E2bError> {
        self.inner.config.as_ref().map_err(|e| e.clone().into())
    }

    fn api(&self) -> Result<Api, E2bError> {
        Api::new(self.config()?)
    }

    fn home_id(&self) -> Result<String, E2bError> {
        let home_id = &self.inner.home_id;
        home_id.get().map_err(|source| E2bError::HomeId {
            path: home_id.path().display().to_string(),
            source,
        })
    }

    /// The metadata that finds a sandbox's VMs, and only this home's.
    fn owner(&self, machine: &Machine<'_>) -> Result<BTreeMap<String, String>, E2bError> {
        Ok(BTreeMap::from([
            (LABEL_HOME.to_owned(), self.home_id()?),
            (LABEL_SANDBOX_ID.to_owned(), machine.id.to_owned()),
        ]))
    }

    fn envd(&self, e2b: &E2bRef) -> Result<Envd, E2bError> {
        Ok(Envd::of(self.config()?, e2b))
    }

    fn agent_endpoint(&self, e2b: &E2bRef) -> Result<Endpoint, E2bError> {
        let headers = e2b
            .traffic_token
            .iter()
            .map(|token| (TRAFFIC_TOKEN_HEADER.to_owned(), token.clone()))
            .collect();
        let config = self.config()?;
        Ok(config.route(AGENT_PORT, &e2b.sandbox_id, e2b.domain.as_deref(), headers))
    }

    /// Gets the agent running in a fresh VM; answers once it answers
    /// through the proxy. When the template carried the agent last time
    /// (`silo image bake` output, the agent at [`BAKED_AGENT_PATH`]), that
    /// one is tried first, while this build's agent uploads in case the
    /// template has changed; otherwise this build's is uploaded with the key.
    async fn install_and_start(&self, e2b: &E2bRef, machine: &Machine<'_>) -> Result<(), E2bError> {
        let agent = self.inner.agent.get()?;
        let bytes = tokio::fs::read(&agent.path)
            .await
            .map_err(|source| E2bError::ReadAgent {
                path: agent.path.display().to_string(),
                source,
            })?;
        let envd = self.envd(e2b)?;
        let upload = envd.upload(AGENT_PATH, bytes.into());
        if machine.agent_in_image {
            let baked = self.start_baked_agent(&envd, e2b, machine);
            tokio::pin!(upload, baked);
            let mut uploaded = None;
            let baked = loop {
                tokio::select! {
                    done = &mut upload, if uploaded.is_none() => uploaded = Some(done),
                    baked = &mut baked => break baked?,
                }
            };
            let key_intact = match baked {
                Baked::Serving => return Ok(()),
                Baked::Absent => true,
                Baked::Exited => false,
            };
            match uploaded {
                Some(done) => done?,
                None => upload.await?,
            }
            if !key_intact {
                self.hand_over_key(&envd, machine).await?;
            }
        } else {
            tokio::try_join!(upload, self.hand_over_key(&envd, machine))?;
        }
        // envd writes files 0644: the agent is made executable by the same
        // process that then becomes it, which saves a round trip.
        let mut argv: Vec<String> = ["/bin/sh", "-c", "chmod 0755 \"$1\" && exec \"$@\"", "sh"]
            .map(str::to_owned)
            .to_vec();
        argv.extend(agent_command(machine.spec));
        self.launch(&envd, e2b, machine, &argv).await
    }

    /// Hands over the key and starts the template's own agent, if it has
    /// one: says whether it serves, was absent (the key is still in
    /// place), or exited (an agent too old for the flags, say).
    async fn start_baked_agent(
        &self,
        envd: &Envd,
        e2b: &E2bRef,
        machine: &Machine<'_>,
    ) -> Result<Baked, E2bError> {
        self.hand_over_key(envd, machine).await?;
        let mut argv: Vec<String> = [
            "/bin/sh",
            "-c",
            "[ -x \"$1\" ] || exit 127; exec \"$@\"",
            "sh",
            BAKED_AGENT_PATH,
        ]
        .map(str::to_owned)
        .to_vec();
        argv.extend(agent_command(machine.spec).into_iter().skip(1));
        let client = AgentClient::new(self.agent_endpoint(e2b)?, machine.key.clone());
        match envd
            .spawn_racing(&argv, &machine.spec.env, wait_for_agent(&client))
            .await?
        {
            Ok(Ok(())) => Ok(Baked::Serving),
            Ok(Err(why)) => Err(E2bError::AgentNotReady {
                id: e2b.sandbox_id.clone(),
                why,
            }),
            Err(127) => Ok(Baked::Absent),
            Err(code) => {
                tracing::info!(
                    vm = e2b.sandbox_id,
                    code,
                    "the template's own agent exited; uploading this build's"
                );
                Ok(Baked::Exited)
            }
        }
    }

    /// Hands the agent its key and starts it (the binary is in place).
    async fn start_agent(&self, e2b: &E2bRef, machine: &Machine<'_>) -> Result<(), E2bError> {
        let envd = self.envd(e2b)?;
        self.hand_over_key(&envd, machine).await?;
        self.launch(&envd, e2b, machine, &agent_command(machine.spec))
            .await
    }

    /// Writes the key where the agent takes it from (and deletes it).
    async fn hand_over_key(&self, envd: &Envd, machine: &Machine<'_>) -> Result<(), E2bError> {
        let key = format!("{}\n", machine.key.to_hex());
        envd.upload(KEY_PATH, key.into()).await
    }

    /// Starts `argv` in the background and waits for the agent to answer.
    async fn launch(
        &self,
        envd: &Envd,
        e2b: &E2bRef,
        machine: &Machine<'_>,
        argv: &[String],
    ) -> Result<(), E2bError> {
        envd.spawn(argv, &machine.spec.env).await?;
        let client = AgentClient::new(self.agent_endpoint(e2b)?, machine.key.clone());
        wait_for_agent(&client)
            .await
            .map_err(|why| E2bError::AgentNotReady {
                id: e2b.sandbox_id.clone(),
                why,
            })
    }

    /// Kills every VM of this home carrying the sandbox's id.
    async fn kill_leftovers(&self, api: &Api, machine: &Machine<'_>) -> Result<(), E2bError> {
        for left in api.find(&self.owner(machine)?).await? {
            tracing::info!(
                sandbox = machine.name,
                vm = left.sandbox_id,
                "killing a VM a failed create left"
            );
            api.kill(&left.sandbox_id).await?;
        }
        Ok(())
    }
}

impl E2bBackend {
    /// Kills this home's VMs whose sandbox is not in `live` (made by a
    /// create that died before recording it, or left by a removal that did
    /// not reach E2B); answers what it killed (or would, on a dry run).
    /// Without an API key there is nothing to sweep.
    async fn sweep(
        &self,
        live: &std::collections::HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, E2bError> {
        let Ok(config) = self.config() else {
            return Ok(Vec::new());
        };
        if config.api_key.is_none() {
            return Ok(Vec::new());
        }
        let api = Api::new(config)?.with_retry_budget(SWEEP_RETRY_BUDGET);
        let mine = BTreeMap::from([(LABEL_HOME.to_owned(), self.home_id()?)]);
        let found = api.find(&mine).await?.into_iter().map(|mut vm| {
            let owner = vm.metadata.remove(LABEL_SANDBOX_ID);
            (vm.sandbox_id, owner)
        });
        let api = &api;
        sweep("e2b", found, live, dry_run, |vm| async move {
            api.kill(&vm).await
        })
        .await
    }
}

fn parse_ref(machine: &Machine<'_>) -> Option<E2bRef> {
    serde_json::from_value::<E2bRef>(machine.backend_ref.clone())
        .ok()
        .filter(|r| !r.sandbox_id.is_empty())
}

fn timeout_secs(config: &E2bConfig) -> u32 {
    u32::try_from(config.timeout.as_secs()).unwrap_or(u32::MAX)
}

impl Backend for E2bBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::E2b
    }

    async fn sweep_orphans(
        &self,
        live: &std::collections::HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, BackendError> {
        Ok(self.sweep(live, dry_run).await?)
    }

    fn snapshot_support(&self) -> SnapshotSupport {
        SnapshotSupport::AgentLayers
    }

    fn stop_keeps_processes(&self) -> bool {
        true
    }

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        let api = self.api()?;
        let config = self.config()?;
        self.kill_leftovers(&api, &machine).await?;
        let mut metadata = self.owner(&machine)?;
        metadata.insert(LABEL_SANDBOX_NAME.to_owned(), machine.name.to_owned());
        metadata.insert(LABEL_SPEC_HASH.to_owned(), machine.spec.hash());
        let template = machine
            .image
            .or(machine.spec.image.as_deref())
            .unwrap_or(config::DEFAULT_TEMPLATE)
            .to_owned();
        let created = api
            .create(&api::NewSandbox {
                template_id: template.clone(),
                timeout: timeout_secs(config),
                auto_pause: true,
                secure: true,
                allow_internet_access: machine.spec.network.as_deref() != Some("none"),
                metadata,
            })
            .await?;
        let e2b = E2bRef::new(created, template);
        if let Err(error) = self.install_and_start(&e2b, &machine).await {
            if let Err(kill) = api.kill(&e2b.sandbox_id).await {
                tracing::warn!(vm = e2b.sandbox_id, "killing a half-made sandbox: {kill}");
            }
            return Err(error.into());
        }
        Ok(serde_json::to_value(&e2b).unwrap_or_default())
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        let Some(e2b) = parse_ref(&machine) else {
            return Ok(MachineState::Missing);
        };
        let Some(listed) = self.api()?.get(&e2b.sandbox_id).await? else {
            return Ok(MachineState::Missing);
        };
        if listed.state != "running" {
            return Ok(MachineState::Stopped);
        }
        let client = AgentClient::new(self.agent_endpoint(&e2b)?, machine.key.clone());
        Ok(if healthy(&client).await {
            MachineState::Running
        } else {
            MachineState::Stopped
        })
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        let Some(e2b) = parse_ref(&machine) else {
            return Err(E2bError::Gone(machine.name.to_owned()).into());
        };
        let config = self.config()?;
        let (_, resumed) = self
            .api()?
            .connect(&e2b.sandbox_id, timeout_secs(config))
            .await?;
        let client = AgentClient::new(self.agent_endpoint(&e2b)?, machine.key.clone());
        let answering = if resumed {
            wait_for_agent(&client).await.is_ok()
        } else {
            healthy(&client).await
        };
        if !answering {
            // The VM runs but the agent does not (it exited on its idle
            // timeout, or was killed): the binary is still there.
            self.start_agent(&e2b, &machine).await?;
        }
        Ok(MachineStarted {
            backend_ref: machine.backend_ref.clone(),
            was_running: !resumed && answering,
        })
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        let Some(e2b) = parse_ref(&machine) else {
            return Ok(false);
        };
        match self.api()?.pause(&e2b.sandbox_id).await {
            Ok(was_running) => Ok(was_running),
            Err(E2bError::Gone(_)) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        let api = self.api()?;
        if let Some(e2b) = parse_ref(&machine) {
            api.kill(&e2b.sandbox_id).await?;
        }
        self.kill_leftovers(&api, &machine).await?;
        Ok(())
    }

    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        let e2b = parse_ref(&machine).ok_or_else(|| E2bError::Gone(machine.name.to_owned()))?;
        Ok(self.agent_endpoint(&e2b)?)
    }

    async fn last_exit(&self, _machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        // A paused E2B sandbox did not exit; an agent that left on its idle
        // timeout is started again by `start`.
        Ok(None)
    }
}
