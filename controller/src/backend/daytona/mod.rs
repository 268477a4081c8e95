//! The Daytona backend: one Daytona sandbox per silo sandbox, with silo's
//! own agent running in it beside Daytona's daemon, on the shared remote
//! layer ([`crate::backend::remote`]).
//!
//! - **Create**: `POST /sandbox` from a snapshot (Daytona's template) with
//!   labels naming this home and sandbox, then wait until it has started;
//!   through its toolbox upload the agent and the key, and start the agent
//!   in the background in a process session that is never deleted. A
//!   create that fails half way deletes what it made, and the next create
//!   first deletes anything left with its labels.
//! - **Stop** is Daytona's stop: files stay, processes end; **start** starts
//!   it again, hands the agent a fresh key file and starts it again (the
//!   binary is still there). Daytona stops a sandbox by itself after
//!   `SILO_DAYTONA_AUTO_STOP` idle minutes; `silo up` starts it again.
//! - **Remove** deletes it and anything else carrying its labels.
//!
//! The agent is reached through the preview proxy at
//! `https://{port}-{id}.{proxyDomain}` with the `x-daytona-preview-token`
//! header, a token that changes whenever the sandbox starts (so every start
//! asks for it again). Requests are signed with the sandbox's key as on
//! every backend; the proxy is not trusted.

pub mod api;
pub mod config;
pub mod error;
pub mod toolbox;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::labels::{LABEL_HOME, LABEL_SANDBOX_ID, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH};
use super::remote::{
    AGENT_PATH, AGENT_PORT, KEY_PATH, SWEEP_RETRY_BUDGET, agent_command, healthy, sweep, tls_route,
    wait_for_agent,
};
use super::{
    Backend, BackendError, LastExit, Machine, MachineStarted, MachineState, SnapshotSupport,
};
use crate::agent_binary::AgentLocator;
use crate::client::{AgentClient, Endpoint};
use crate::home::{Home, HomeId};
use crate::spec::BackendKind;

pub use api::Api;
pub use config::{DaytonaConfig, DaytonaConfigError};
pub use error::DaytonaError;
pub use toolbox::Toolbox;

/// The header the preview proxy wants on a sandbox that is not public.
pub const PREVIEW_TOKEN_HEADER: &str = "x-daytona-preview-token";
/// The process session the agent runs in.
const AGENT_SESSION: &str = "silo-agent";

/// Runs sandboxes as Daytona sandboxes.
#[derive(Debug, Clone)]
pub struct DaytonaBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    agent: Arc<AgentLocator>,
    /// Read once from the environment; an error is kept and told on use,
    /// so a home without Daytona settings still opens.
    config: Result<DaytonaConfig, DaytonaConfigError>,
    home_id: HomeId,
}

/// What silo keeps to find its Daytona sandbox again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaytonaRef {
    /// Daytona's id of the sandbox.
    pub sandbox_id: String,
    /// The snapshot it was made from.
    pub snapshot: String,
    /// Its toolbox proxy URL.
    pub toolbox_url: String,
    /// The agent port's preview host (`{port}-{id}.{proxyDomain}`).
    pub preview_host: String,
    /// The preview proxy's token since the sandbox last started.
    pub preview_token: String,
}

impl DaytonaBackend {
    /// The Daytona backend of a home, with the configuration given or
    /// else the environment's.
    pub(crate) fn open(setup: &super::BackendSetup) -> Self {
        let config = setup
            .daytona
            .clone()
            .map_or_else(DaytonaConfig::from_env, Ok);
        Self::with_config(setup.home.clone(), Arc::clone(&setup.agent), config)
    }

    /// A Daytona backend with the configuration given.
    pub fn with_config(
        home: Home,
        agent: Arc<AgentLocator>,
        config: Result<DaytonaConfig, DaytonaConfigError>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                home_id: HomeId::of(&home),
                agent,
                config,
            }),
        }
    }

    fn config(&self) -> Result<&DaytonaConfig, DaytonaError> {
        self.inner.config.as_ref().map_err(|e| e.clone().into())
    }

    fn api(&self) -> Result<Api, DaytonaError> {
        Api::new(self.config()?)
    }

    fn toolbox(&self, daytona: &DaytonaRef) -> Result<Toolbox, DaytonaError> {
        Toolbox::new(self.config()?, &daytona.toolbox_url, &daytona.sandbox_id)
    }

    fn home_id(&self) -> Result<String, DaytonaError> {
        let home_id = &self.inner.home_id;
        home_id.get().map_err(|source| DaytonaError::HomeId {
            path: home_id.path().display().to_string(),
            source,
        })
    }

    /// The labels that find a sandbox's Daytona sandboxes, and only this
    /// home's.
    fn owner(&self, machine: &Machine<'_>) -> Result<BTreeMap<String, String>, DaytonaError> {
        Ok(BTreeMap::from([
            (LABEL_HOME.to_owned(), self.home_id()?),
            (LABEL_SANDBOX_ID.to_owned(), machine.id.to_owned()),
        ]))
    }

    fn agent_endpoint(&self, daytona: &DaytonaRef) -> Result<Endpoint, DaytonaError> {
        let config = self.config()?;
        Ok(tls_route(
            daytona.preview_host.clone(),
            config.proxy.as_ref(),
            config.ca_pem.clone(),
            vec![(
                PREVIEW_TOKEN_HEADER.to_owned(),
                daytona.preview_token.clone(),
            )],
        ))
    }

    /// The agent port's preview host and token now.
    async fn preview(&self, api: &Api, id: &str) -> Result<(String, String), DaytonaError> {
        let preview = api.preview_url(id, AGENT_PORT).await?;
        let host = preview
            .url
            .parse::<http::Uri>()
            .ok()
            .and_then(|uri| uri.host().map(str::to_owned))
            .ok_or_else(|| DaytonaError::Unexpected {
                what: "a preview URL",
                why: format!("{:?} has no host", preview.url),
            })?;
        Ok((host, preview.token))
    }

    /// Uploads the agent and the key and starts the agent; answers once it
    /// answers through the preview proxy.
    async fn install_and_start(
        &self,
        daytona: &DaytonaRef,
        machine: &Machine<'_>,
    ) -> Result<(), DaytonaError> {
        let agent = self.inner.agent.get()?;
        let bytes =
            tokio::fs::read(&agent.path)
                .await
                .map_err(|source| DaytonaError::ReadAgent {
                    path: agent.path.display().to_string(),
                    source,
                })?;
        let toolbox = self.toolbox(daytona)?;
        tokio::try_join!(
            toolbox.upload(AGENT_PATH, bytes.into()),
            self.hand_over_key(&toolbox, machine),
        )?;
        self.launch(&toolbox, daytona, machine).await
    }

    /// Writes the key where the agent takes it from (and deletes it).
    async fn hand_over_key(
        &self,
        toolbox: &Toolbox,
        machine: &Machine<'_>,
    ) -> Result<(), DaytonaError> {
        let key = format!("{}\n", machine.key.to_hex());
        toolbox.upload(KEY_PATH, key.into()).await
    }

    /// Starts the agent in its session and waits for it to answer.
    async fn launch(
        &self,
        toolbox: &Toolbox,
        daytona: &DaytonaRef,
        machine: &Machine<'_>,
    ) -> Result<(), DaytonaError> {
        toolbox
            .run_in_background(AGENT_SESSION, &start_line(machine))
            .await?;
        let client = AgentClient::new(self.agent_endpoint(daytona)?, machine.key.clone());
        wait_for_agent(&client)
            .await
            .map_err(|why| DaytonaError::AgentNotReady {
                id: daytona.sandbox_id.clone(),
                why,
            })
    }

    /// Deletes every Daytona sandbox of this home carrying the sandbox's id.
    async fn delete_leftovers(&self, api: &Api, machine: &Machine<'_>) -> Result<(), DaytonaError> {
        for left in api.find(&self.owner(machine)?).await? {
            tracing::info!(
                sandbox = machine.name,
                daytona = left.id,
                "deleting a Daytona sandbox a failed create left"
            );
            api.delete(&left.id).await?;
        }
        Ok(())
    }

    /// Deletes this home's Daytona sandboxes whose silo sandbox is not in
    /// `live`; answers what it deleted (or would, on a dry run). Without an
    /// API key there is nothing to sweep.
    async fn sweep(
        &self,
        live: &std::collections::HashSet<String>,
        dry_run: bool,
    ) -> Result<Vec<String>, DaytonaError> {
        let Ok(config) = self.config() else {
            return Ok(Vec::new());
        };
        if config.api_key.is_none() {
            return Ok(Vec::new());
        }
        let api = Api::new(config)?.with_retry_budget(SWEEP_RETRY_BUDGET);
        let mine = BTreeMap::from([(LABEL_HOME.to_owned(), self.home_id()?)]);
        let found = api.find(&mine).await?.into_iter().map(|mut sandbox| {
            let owner = sandbox.labels.remove(LABEL_SANDBOX_ID);
            (sandbox.id, owner)
        });
        let api = &api;
        sweep("daytona", found, live, dry_run, |id| async move {
            api.delete(&id).await
        })
        .await
    }
}

/// The shell line the toolbox runs to start the agent: made executable
/// (uploads are not) by the process that then becomes the agent.
fn start_line(machine: &Machine<'_>) -> String {
    let words: Vec<String> = agent_command(machine.spec)
        .iter()
        .map(|word| {
            String::from_utf8_lossy(&silo_protocol::session::quote(word.as_bytes())).into_owned()
        })
        .collect();
    format!("chmod 0755 {AGENT_PATH} && exec {}", words.join(" "))
}

fn parse_ref(machine: &Machine<'_>) -> Option<DaytonaRef> {
    serde_json::from_value::<DaytonaRef>(machine.backend_ref.clone())
        .ok()
        .filter(|r| !r.sandbox_id.is_empty())
}

impl Backend for DaytonaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Daytona
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

    async fn create(&self, machine: Machine<'_>) -> Result<serde_json::Value, BackendError> {
        let api = self.api()?;
        let config = self.config()?;
        self.delete_leftovers(&api, &machine).await?;
        let mut labels = self.owner(&machine)?;
        labels.insert(LABEL_SANDBOX_NAME.to_owned(), machine.name.to_owned());
        labels.insert(LABEL_SPEC_HASH.to_owned(), machine.spec.hash());
        let created = api
            .create(&api::NewSandbox {
                snapshot: machine
                    .image
                    .or(machine.spec.image.as_deref())
                    .map(str::to_owned),
                env: machine.spec.env.clone(),
                labels,
                public: false,
                network_block_all: machine.spec.network.as_deref() == Some("none"),
                auto_stop_interval: config.auto_stop_minutes,
                target: config.target.clone(),
            })
            .await?;
        let id = created.id.clone();
        let made = async {
            let started = api.wait_for(&id, "started").await?;
            let toolbox_url = started
                .toolbox_proxy_url
                .clone()
                .or(created.toolbox_proxy_url)
                .ok_or_else(|| DaytonaError::Unexpected {
                    what: "a sandbox",
                    why: "it has no toolboxProxyUrl".into(),
                })?;
            let (preview_host, preview_token) = self.preview(&api, &id).await?;
            let daytona = DaytonaRef {
                sandbox_id: id.clone(),
                snapshot: started.snapshot.clone().unwrap_or_default(),
                toolbox_url,
                preview_host,
                preview_token,
            };
            self.install_and_start(&daytona, &machine).await?;
            Ok::<_, DaytonaError>(daytona)
        }
        .await;
        match made {
            Ok(daytona) => Ok(serde_json::to_value(&daytona).unwrap_or_default()),
            Err(error) => {
                if let Err(delete) = api.delete(&id).await {
                    tracing::warn!(daytona = id, "deleting a half-made sandbox: {delete}");
                }
                Err(error.into())
            }
        }
    }

    async fn status(&self, machine: Machine<'_>) -> Result<MachineState, BackendError> {
        let Some(daytona) = parse_ref(&machine) else {
            return Ok(MachineState::Missing);
        };
        let Some(found) = self.api()?.get(&daytona.sandbox_id).await? else {
            return Ok(MachineState::Missing);
        };
        if found.state() != "started" {
            return Ok(MachineState::Stopped);
        }
        let client = AgentClient::new(self.agent_endpoint(&daytona)?, machine.key.clone());
        Ok(if healthy(&client).await {
            MachineState::Running
        } else {
            MachineState::Stopped
        })
    }

    async fn start(&self, machine: Machine<'_>) -> Result<MachineStarted, BackendError> {
        let Some(mut daytona) = parse_ref(&machine) else {
            return Err(DaytonaError::Gone(machine.name.to_owned()).into());
        };
        let api = self.api()?;
        let found = api
            .get(&daytona.sandbox_id)
            .await?
            .ok_or_else(|| DaytonaError::Gone(daytona.sandbox_id.clone()))?;
        let was_started = found.state() == "started";
        if !was_started {
            api.start(&daytona.sandbox_id).await?;
            api.wait_for(&daytona.sandbox_id, "started").await?;
            // A start hands out a new preview token.
            let (host, token) = self.preview(&api, &daytona.sandbox_id).await?;
            daytona.preview_host = host;
            daytona.preview_token = token;
        }
        let client = AgentClient::new(self.agent_endpoint(&daytona)?, machine.key.clone());
        let answering = was_started && healthy(&client).await;
        if !answering {
            // A stop ended the agent (or it left on its idle timeout); its
            // binary is still there.
            let toolbox = self.toolbox(&daytona)?;
            self.hand_over_key(&toolbox, &machine).await?;
            self.launch(&toolbox, &daytona, &machine).await?;
        }
        Ok(MachineStarted {
            backend_ref: serde_json::to_value(&daytona).unwrap_or_default(),
            was_running: answering,
        })
    }

    async fn stop(&self, machine: Machine<'_>) -> Result<bool, BackendError> {
        let Some(daytona) = parse_ref(&machine) else {
            return Ok(false);
        };
        let api = self.api()?;
        let Some(found) = api.get(&daytona.sandbox_id).await? else {
            return Ok(false);
        };
        if found.state() == "stopped" {
            return Ok(false);
        }
        match api.stop(&daytona.sandbox_id).await {
            Ok(()) => {}
            Err(DaytonaError::Gone(_)) => return Ok(false),
            Err(error) => return Err(error.into()),
        }
        api.wait_for(&daytona.sandbox_id, "stopped").await?;
        Ok(true)
    }

    async fn remove(&self, machine: Machine<'_>) -> Result<(), BackendError> {
        let api = self.api()?;
        // One already being deleted (behind silo's back) refuses another
        // delete with 409; it is as good as gone.
        if let Some(daytona) = parse_ref(&machine)
            && api.get(&daytona.sandbox_id).await?.is_some()
        {
            api.delete(&daytona.sandbox_id).await?;
        }
        self.delete_leftovers(&api, &machine).await?;
        Ok(())
    }

    fn endpoint(&self, machine: Machine<'_>) -> Result<Endpoint, BackendError> {
        let daytona =
            parse_ref(&machine).ok_or_else(|| DaytonaError::Gone(machine.name.to_owned()))?;
        Ok(self.agent_endpoint(&daytona)?)
    }

    async fn last_exit(&self, _machine: Machine<'_>) -> Result<Option<LastExit>, BackendError> {
        // Daytona's stop does not tell how the agent ended; `start` starts
        // it again either way.
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::spec::SandboxSpec;
    use silo_protocol::auth::Key;

    #[test]
    fn the_agent_starts_with_every_word_quoted() {
        let mut spec = SandboxSpec::new(BackendKind::Daytona);
        spec.workload = vec!["sh".into(), "-c".into(), "echo 'hi'".into()];
        let key = Key::generate().unwrap();
        let backend_ref = serde_json::json!({});
        let machine = Machine {
            id: "sbx-000000000001",
            name: "a",
            spec: &spec,
            backend_ref: &backend_ref,
            key: &key,
            image: None,
            agent_in_image: false,
        };
        let line = start_line(&machine);
        assert!(
            line.starts_with(&format!("chmod 0755 {AGENT_PATH} && exec '{AGENT_PATH}' ")),
            "{line}"
        );
        assert!(line.ends_with(r"'sh' '-c' 'echo '\''hi'\'''"), "{line}");
    }
}
