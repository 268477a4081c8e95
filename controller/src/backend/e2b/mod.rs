//! The E2B backend: one E2B sandbox (a Firecracker VM from a template) per
//! silo sandbox, with silo's own agent running in it beside E2B's envd.
//!
//! - **Create**: `POST /v2/sandboxes` (or v1's `POST /sandboxes`, see
//!   [`api`]) with auto-pause (so E2B's timeout pauses
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

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::BackendSetup;
use super::remote::backend::{Power, Provider, RemoteBackend, Woke};
use super::remote::config::ProviderConfigError;
use super::remote::error::RemoteError;
use super::remote::{AGENT_PATH, AGENT_PORT, SWEEP_RETRY_BUDGET, agent_command, wait_for_agent};
use super::{Machine, PortUrl};
use crate::client::Endpoint;
use crate::image::BAKED_AGENT_PATH;
use crate::spec::{BackendKind, SandboxSpec};

pub use api::Api;
pub use config::E2bConfig;
pub use envd::Envd;
pub use error::E2bError;

/// Runs sandboxes as E2B sandboxes.
pub type E2bBackend = RemoteBackend<E2b>;

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

/// E2B's API mapping.
#[derive(Debug)]
pub struct E2b {
    /// Read once from the environment; an error is kept and told on use,
    /// so a home without E2B settings still opens.
    config: Result<E2bConfig, ProviderConfigError>,
    /// What the API clients learn of E2B's routes (which generation of the
    /// create and connect routes it serves), shared by all of them.
    dialect: api::E2bDialect,
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
    /// The generation of E2B's routes that made it (none recorded: try
    /// the newest first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<api::Version>,
    /// The memory snapshot it was made from (`silo fork --memory`), whose
    /// template goes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_snapshot: Option<String>,
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
            api: created.version,
            memory_snapshot: None,
        }
    }
}

impl E2b {
    fn config(&self) -> Result<&E2bConfig, E2bError> {
        self.config.as_ref().map_err(|e| e.clone().into())
    }

    fn api(&self) -> Result<Api, E2bError> {
        Api::speaking(self.config()?, self.dialect.clone())
    }

    fn envd(&self, e2b: &E2bRef) -> Result<Envd, E2bError> {
        Ok(Envd::of(self.config()?, e2b))
    }

    /// The traffic token's header, on a sandbox whose public traffic is
    /// restricted.
    fn traffic_headers(&self, e2b: &E2bRef) -> Vec<(String, String)> {
        e2b.traffic_token
            .iter()
            .map(|token| (TRAFFIC_TOKEN_HEADER.to_owned(), token.clone()))
            .collect()
    }

    fn timeout_secs(&self) -> Result<u32, E2bError> {
        Ok(u32::try_from(self.config()?.own.timeout.as_secs()).unwrap_or(u32::MAX))
    }
}

impl Provider for E2b {
    type Ref = E2bRef;
    type Error = E2bError;
    const NAME: &'static str = config::NAME;
    const KIND: BackendKind = BackendKind::E2b;
    const FORKS_MEMORY: bool = true;

    fn stop_keeps_processes(_: &E2bRef) -> bool {
        true
    }

    fn open(setup: &BackendSetup) -> Self {
        Self {
            config: setup.e2b.clone().map_or_else(E2bConfig::from_env, Ok),
            dialect: api::E2bDialect::default(),
        }
    }

    fn machine_id(reference: &E2bRef) -> &str {
        &reference.sandbox_id
    }

    fn gone(id: String) -> E2bError {
        E2bError::Gone(id)
    }

    fn configured(&self) -> bool {
        self.config().is_ok_and(|config| config.api_key.is_some())
    }

    /// `PUT /sandboxes/{id}/network` with the rules a create from `spec`
    /// would carry (none: every egress rule cleared).
    async fn set_egress(&self, e2b: &E2bRef, spec: &SandboxSpec) -> Result<(), E2bError> {
        let mut rules = api::egress_rules(spec).unwrap_or_else(|| json!({}));
        if spec.offline() {
            rules["allow_internet_access"] = false.into();
        }
        self.api()?.update_network(&e2b.sandbox_id, &rules).await
    }

    async fn create(
        &self,
        machine: &Machine<'_>,
        metadata: BTreeMap<String, String>,
    ) -> Result<E2bRef, E2bError> {
        let template = machine
            .image
            .or(machine.spec.image.as_deref())
            .unwrap_or(config::DEFAULT_TEMPLATE)
            .to_owned();
        let offline = machine.spec.offline();
        let network = api::egress_rules(machine.spec);
        let created = self
            .api()?
            .create(&api::NewSandbox {
                template_id: template.clone(),
                timeout: self.timeout_secs()?,
                auto_pause: true,
                allow_internet_access: !offline,
                network,
                metadata,
            })
            .await?;
        let mut e2b = E2bRef::new(created, template.clone());
        e2b.memory_snapshot = machine.from_memory.then_some(template);
        Ok(e2b)
    }

    async fn power(&self, id: &str) -> Result<Option<Power>, E2bError> {
        Ok(self.api()?.get(id).await?.map(|listed| {
            if listed.state == "running" {
                Power::Running
            } else {
                Power::Stopped
            }
        }))
    }

    async fn resume(&self, e2b: &mut E2bRef) -> Result<Woke, E2bError> {
        // `connect` resumes a paused sandbox and renews the timeout.
        let (connected, resumed) = self
            .api()?
            .connect(&e2b.sandbox_id, self.timeout_secs()?, e2b.api)
            .await?;
        e2b.api = connected.version;
        Ok(if resumed {
            Woke::Resumed
        } else {
            Woke::AlreadyUp
        })
    }

    async fn pause(&self, id: &str) -> Result<bool, E2bError> {
        match self.api()?.pause(id).await {
            Ok(was_running) => Ok(was_running),
            Err(E2bError::Gone(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), E2bError> {
        self.api()?.kill(id).await
    }

    async fn release(&self, e2b: &E2bRef) -> Result<(), E2bError> {
        match &e2b.memory_snapshot {
            Some(snapshot) => self.drop_capture(snapshot).await,
            None => Ok(()),
        }
    }

    /// The snapshot's template goes as E2B's client deletes a snapshot
    /// (`DELETE /templates/{id}`).
    async fn drop_capture(&self, snapshot: &str) -> Result<(), E2bError> {
        self.api()?.delete_template(snapshot).await
    }

    /// E2B's snapshot with memory (`POST /sandboxes/{id}/snapshots`), which
    /// a create then resumes as a new sandbox with silo's own metadata.
    /// E2B's fork route would copy the original's metadata, which names
    /// the original sandbox as the machine's owner, and E2B has no route to
    /// change it.
    async fn capture_memory(&self, e2b: &E2bRef, name: &str) -> Result<String, E2bError> {
        self.api()?.snapshot(&e2b.sandbox_id, name).await
    }

    async fn find(
        &self,
        metadata: &BTreeMap<String, String>,
        sweeping: bool,
    ) -> Result<Vec<(String, Option<String>)>, E2bError> {
        let mut api = self.api()?;
        if sweeping {
            api = api.with_retry_budget(SWEEP_RETRY_BUDGET);
        }
        api.find(metadata).await
    }

    async fn upload(&self, e2b: &E2bRef, path: &str, bytes: Vec<u8>) -> Result<(), E2bError> {
        self.envd(e2b)?.upload(path, bytes.into()).await
    }

    async fn start_agent_process(
        &self,
        e2b: &E2bRef,
        machine: &Machine<'_>,
    ) -> Result<(), E2bError> {
        // envd writes files 0644: the agent is made executable by the same
        // process that then becomes it, which saves a round trip.
        let mut argv: Vec<String> = ["/bin/sh", "-c", "chmod 0755 \"$1\" && exec \"$@\"", "sh"]
            .map(str::to_owned)
            .to_vec();
        argv.extend(agent_command(machine.spec));
        self.envd(e2b)?.spawn(&argv, &machine.spec.env).await
    }

    fn agent_endpoint(&self, e2b: &E2bRef) -> Result<Endpoint, E2bError> {
        let headers = self.traffic_headers(e2b);
        let config = self.config()?;
        Ok(config.route(AGENT_PORT, &e2b.sandbox_id, e2b.domain.as_deref(), headers))
    }

    /// E2B's proxy host for the port, as its SDK's `get_host` makes it; a
    /// sandbox whose public traffic is restricted wants its token too.
    async fn port_url(&self, e2b: &E2bRef, port: u16) -> Result<PortUrl, E2bError> {
        let host = self
            .config()?
            .sandbox_host(port, &e2b.sandbox_id, e2b.domain.as_deref());
        Ok(PortUrl {
            url: format!("https://{host}"),
            host,
            headers: self.traffic_headers(e2b),
        })
    }

    /// When the template carried the agent last time (`silo image bake`
    /// output, the agent at [`BAKED_AGENT_PATH`]), that one is tried first,
    /// while this build's agent uploads in case the template has changed;
    /// otherwise this build's is uploaded with the key.
    async fn install(
        backend: &E2bBackend,
        e2b: &E2bRef,
        machine: &Machine<'_>,
    ) -> Result<(), E2bError> {
        if e2b.memory_snapshot.is_some() {
            end_inherited_agent(backend, e2b).await?;
        }
        if !machine.agent_in_image {
            return backend.upload_and_start(e2b, machine).await;
        }
        let bytes = backend.agent_bytes().await?;
        let envd = backend.provider().envd(e2b)?;
        let upload = envd.upload(AGENT_PATH, bytes.into());
        let baked = start_baked_agent(backend, &envd, e2b, machine);
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
            backend.hand_over_key(e2b, machine).await?;
        }
        backend.launch(e2b, machine).await
    }
}

/// Ends the agent a sandbox resumed from another's memory brought along:
/// it holds the agent's port and answers only the other sandbox's key,
/// and the new agent takes its place. The processes it started run on.
async fn end_inherited_agent(backend: &E2bBackend, e2b: &E2bRef) -> Result<(), E2bError> {
    let argv = [
        "/bin/sh",
        "-c",
        "for p in /proc/[0-9]*; do \
           [ \"$(readlink \"$p/exe\")\" = \"$1\" ] && kill -9 \"${p#/proc/}\"; \
         done; true",
        "sh",
        AGENT_PATH,
    ]
    .map(str::to_owned);
    let ended = backend.provider().envd(e2b)?.run(&argv).await?;
    if ended.exit_code != 0 {
        return Err(E2bError::Envd(format!(
            "ending the agent the memory snapshot brought along exited {}: {}",
            ended.exit_code, ended.output
        )));
    }
    Ok(())
}

/// Hands over the key and starts the template's own agent, if it has one:
/// says whether it serves, was absent (the key is still in place), or
/// exited (an agent too old for the flags, say).
async fn start_baked_agent(
    backend: &E2bBackend,
    envd: &Envd,
    e2b: &E2bRef,
    machine: &Machine<'_>,
) -> Result<Baked, E2bError> {
    backend.hand_over_key(e2b, machine).await?;
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
    let client = backend.agent_client(e2b, machine)?;
    match envd
        .spawn_racing(&argv, &machine.spec.env, wait_for_agent(&client))
        .await?
    {
        Ok(Ok(())) => Ok(Baked::Serving),
        Ok(Err(why)) => Err(RemoteError::AgentNotReady {
            provider: E2b::NAME,
            id: e2b.sandbox_id.clone(),
            why,
        }
        .into()),
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
