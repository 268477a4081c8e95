//! The Daytona backend: one Daytona sandbox per silo sandbox, with silo's
//! own agent running in it beside Daytona's daemon: Daytona's API mapping
//! ([`Daytona`]) under the one remote backend
//! ([`crate::backend::remote::backend`]).
//!
//! - **Create**: `POST /sandbox` from a template (what Daytona calls a
//!   snapshot, unrelated to silo's) with
//!   labels naming this home and sandbox, then wait until it has started;
//!   through its toolbox upload the agent and the key, and start the agent
//!   in the background in a process session that is never deleted. A
//!   create that fails half way deletes what it made, and the next create
//!   first deletes anything left with its labels.
//! - **Stop** is Daytona's pause for a VM sandbox (`linux-vm`: memory and
//!   processes kept, and **start** resumes them, the agent answering as it
//!   was), and Daytona's stop for a container one: files stay, processes
//!   end; **start** starts it again, hands the agent a fresh key file and
//!   starts it again (the binary is still there). Daytona stops a sandbox by itself after
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

use serde::{Deserialize, Serialize};

use super::remote::backend::{Power, Provider, RemoteBackend, Woke};
use super::remote::config::ProviderConfigError;
use super::remote::{
    AGENT_PATH, AGENT_PORT, SWEEP_RETRY_BUDGET, agent_command, tls_route, url_route,
};
use super::{BackendSetup, Machine, PortUrl};
use crate::client::Endpoint;
use crate::spec::{BackendKind, SandboxSpec, egress};

pub use api::Api;
pub use config::DaytonaConfig;
pub use error::DaytonaError;
pub use toolbox::Toolbox;

/// An allow-list as Daytona takes it: comma-separated, absent when empty.
fn listed(entries: &[String]) -> Option<String> {
    (!entries.is_empty()).then(|| entries.join(","))
}

/// Runs sandboxes as Daytona sandboxes.
pub type DaytonaBackend = RemoteBackend<Daytona>;

/// The header the preview proxy wants on a sandbox that is not public.
pub const PREVIEW_TOKEN_HEADER: &str = "x-daytona-preview-token";
/// The process session the agent runs in.
const AGENT_SESSION: &str = "silo-agent";

/// Daytona's API mapping.
#[derive(Debug)]
pub struct Daytona {
    /// Read once from the environment; an error is kept and told on use,
    /// so a home without Daytona settings still opens.
    config: Result<DaytonaConfig, ProviderConfigError>,
}

/// What silo keeps to find its Daytona sandbox again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaytonaRef {
    /// Daytona's id of the sandbox.
    pub sandbox_id: String,
    /// The template it was made from (Daytona's "snapshot"; the name it
    /// was recorded under before).
    #[serde(alias = "snapshot")]
    pub template: String,
    /// Its toolbox proxy URL.
    pub toolbox_url: String,
    /// The agent port's preview host (`{port}-{id}.{proxyDomain}`).
    pub preview_host: String,
    /// The agent port's whole preview URL, whose scheme and port the
    /// agent is reached with (`https://` and 443 when not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_url: Option<String>,
    /// The preview proxy's token since the sandbox last started.
    pub preview_token: String,
    /// Its `sandboxClass` (`container`, `linux-vm`), when Daytona named
    /// it: a VM's stop is a pause, which keeps its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_class: Option<String>,
}

impl Daytona {
    fn config(&self) -> Result<&DaytonaConfig, DaytonaError> {
        self.config.as_ref().map_err(|e| e.clone().into())
    }

    fn api(&self) -> Result<Api, DaytonaError> {
        Api::new(self.config()?)
    }

    fn toolbox(&self, daytona: &DaytonaRef) -> Result<Toolbox, DaytonaError> {
        Toolbox::new(self.config()?, &daytona.toolbox_url, &daytona.sandbox_id)
    }

    /// The agent port's preview URL, host and token now.
    async fn preview(&self, api: &Api, id: &str) -> Result<Preview, DaytonaError> {
        let preview = api.preview_url(id, AGENT_PORT).await?;
        let uri = preview_uri(&preview.url)?;
        Ok(Preview {
            host: uri.host().unwrap_or_default().to_owned(),
            url: preview.url,
            token: preview.token,
        })
    }

    /// What to keep of sandbox `id` once it has started.
    async fn started(&self, api: &Api, created: api::Sandbox) -> Result<DaytonaRef, DaytonaError> {
        let id = created.id.clone();
        let started = api.wait_for(&id, "started").await?;
        let toolbox_url = started
            .toolbox_proxy_url
            .clone()
            .or(created.toolbox_proxy_url)
            .ok_or_else(|| DaytonaError::Unexpected {
                what: "a sandbox",
                why: "it has no toolboxProxyUrl".into(),
            })?;
        let preview = self.preview(api, &id).await?;
        Ok(DaytonaRef {
            sandbox_id: id,
            sandbox_class: started.sandbox_class.clone().or(created.sandbox_class),
            template: started.snapshot.clone().unwrap_or_default(),
            toolbox_url,
            preview_host: preview.host,
            preview_url: Some(preview.url),
            preview_token: preview.token,
        })
    }
}

impl Provider for Daytona {
    type Ref = DaytonaRef;
    type Error = DaytonaError;
    const NAME: &'static str = config::NAME;
    const KIND: BackendKind = BackendKind::Daytona;
    /// A VM sandbox's stop is Daytona's pause ([`Provider::pause`]).
    fn stop_keeps_processes(daytona: &DaytonaRef) -> bool {
        daytona.sandbox_class.as_deref() == Some(api::PAUSABLE_CLASS)
    }

    fn open(setup: &BackendSetup) -> Self {
        Self {
            config: setup
                .daytona
                .clone()
                .map_or_else(DaytonaConfig::from_env, Ok),
        }
    }

    fn machine_id(reference: &DaytonaRef) -> &str {
        &reference.sandbox_id
    }

    fn gone(id: String) -> DaytonaError {
        DaytonaError::Gone(id)
    }

    fn configured(&self) -> bool {
        self.config().is_ok_and(|config| config.api_key.is_some())
    }

    /// `network-settings` with the spec's allow-lists whole (a blank list
    /// clears Daytona's rule).
    async fn set_egress(
        &self,
        daytona: &DaytonaRef,
        spec: &SandboxSpec,
    ) -> Result<(), DaytonaError> {
        let (cidrs, hosts) = egress::split(&spec.allow_out);
        let settings = api::NetworkSettings {
            network_block_all: spec.offline(),
            network_allow_list: cidrs.join(","),
            domain_allow_list: hosts.join(","),
        };
        self.api()?
            .update_network(Self::machine_id(daytona), &settings)
            .await
    }

    async fn create(
        &self,
        machine: &Machine<'_>,
        labels: BTreeMap<String, String>,
    ) -> Result<DaytonaRef, DaytonaError> {
        let api = self.api()?;
        let config = self.config()?;
        let (cidrs, hosts) = egress::split(&machine.spec.allow_out);
        let created = api
            .create(&api::NewSandbox {
                snapshot: machine
                    .image
                    .or(machine.spec.image.as_deref())
                    .map(str::to_owned),
                env: machine.spec.env.clone(),
                labels,
                public: false,
                network_block_all: machine.spec.offline(),
                network_allow_list: listed(&cidrs),
                domain_allow_list: listed(&hosts),
                auto_stop_interval: config.own.auto_stop_minutes,
                target: config.own.target.clone(),
            })
            .await?;
        let id = created.id.clone();
        match self.started(&api, created).await {
            Ok(daytona) => Ok(daytona),
            Err(error) => {
                if let Err(delete) = api.delete(&id).await {
                    tracing::warn!(daytona = id, "deleting a half-made sandbox: {delete}");
                }
                Err(error)
            }
        }
    }

    async fn power(&self, id: &str) -> Result<Option<Power>, DaytonaError> {
        Ok(self.api()?.get(id).await?.map(|found| {
            if found.state() == "started" {
                Power::Running
            } else {
                Power::Stopped
            }
        }))
    }

    async fn resume(&self, daytona: &mut DaytonaRef) -> Result<Woke, DaytonaError> {
        let api = self.api()?;
        let found = api
            .get(&daytona.sandbox_id)
            .await?
            .ok_or_else(|| DaytonaError::Gone(daytona.sandbox_id.clone()))?;
        if found.sandbox_class.is_some() {
            daytona.sandbox_class.clone_from(&found.sandbox_class);
        }
        let woke = match found.state() {
            "started" => return Ok(Woke::AlreadyUp),
            // A start resumes a pause (`resuming`, then `started`).
            "paused" | "pausing" => Woke::Resumed,
            _ => Woke::Restarted,
        };
        if found.state() == "pausing" {
            api.wait_for(&daytona.sandbox_id, "paused").await?;
        }
        api.start(&daytona.sandbox_id).await?;
        api.wait_for(&daytona.sandbox_id, "started").await?;
        // A start hands out a new preview token.
        let preview = self.preview(&api, &daytona.sandbox_id).await?;
        daytona.keep(preview);
        Ok(woke)
    }

    /// A VM sandbox (`linux-vm`) is paused, keeping memory and processes;
    /// Daytona pauses nothing else, so a container sandbox is stopped.
    async fn pause(&self, id: &str) -> Result<bool, DaytonaError> {
        let api = self.api()?;
        let Some(found) = api.get(id).await? else {
            return Ok(false);
        };
        if matches!(found.state(), "stopped" | "paused") {
            return Ok(false);
        }
        let (done, wanted) = if found.pausable() {
            (api.pause(id).await, "paused")
        } else {
            (api.stop(id).await, "stopped")
        };
        match done {
            Ok(()) => {}
            Err(DaytonaError::Gone(_)) => return Ok(false),
            Err(error) => return Err(error),
        }
        api.wait_for(id, wanted).await?;
        Ok(true)
    }

    async fn delete(&self, id: &str) -> Result<(), DaytonaError> {
        let api = self.api()?;
        // One already being deleted (behind silo's back) refuses another
        // delete with 409; it is as good as gone.
        if api.get(id).await?.is_some() {
            api.delete(id).await?;
        }
        Ok(())
    }

    async fn find(
        &self,
        labels: &BTreeMap<String, String>,
        sweeping: bool,
    ) -> Result<Vec<(String, Option<String>)>, DaytonaError> {
        let mut api = self.api()?;
        if sweeping {
            api = api.with_retry_budget(SWEEP_RETRY_BUDGET);
        }
        api.find(labels).await
    }

    async fn upload(
        &self,
        daytona: &DaytonaRef,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<(), DaytonaError> {
        self.toolbox(daytona)?.upload(path, bytes.into()).await
    }

    async fn start_agent_process(
        &self,
        daytona: &DaytonaRef,
        machine: &Machine<'_>,
    ) -> Result<(), DaytonaError> {
        self.toolbox(daytona)?
            .run_in_background(AGENT_SESSION, &start_line(machine))
            .await
    }

    /// A preview token lapses (a restart of Daytona's proxy, a token
    /// revoked): `/ports/{port}/preview-url` hands out the current one.
    async fn refresh_access(&self, daytona: &mut DaytonaRef) -> Result<bool, DaytonaError> {
        let preview = self.preview(&self.api()?, &daytona.sandbox_id).await?;
        daytona.keep(preview);
        Ok(true)
    }

    /// Daytona's preview URL of the port, asked of its API (the host is
    /// its own choice), with the token a private sandbox's proxy wants.
    async fn port_url(&self, daytona: &DaytonaRef, port: u16) -> Result<PortUrl, DaytonaError> {
        let preview = self.api()?.preview_url(&daytona.sandbox_id, port).await?;
        let uri = preview_uri(&preview.url)?;
        let host = uri
            .authority()
            .map(|authority| authority.as_str().to_owned())
            .unwrap_or_default();
        Ok(PortUrl {
            host,
            url: preview.url,
            headers: vec![(PREVIEW_TOKEN_HEADER.to_owned(), preview.token)],
        })
    }

    /// The agent port's preview URL as Daytona gave it: its scheme, host
    /// and port (in the `Host` header too), with the token.
    fn agent_endpoint(&self, daytona: &DaytonaRef) -> Result<Endpoint, DaytonaError> {
        let config = self.config()?;
        let headers = vec![(
            PREVIEW_TOKEN_HEADER.to_owned(),
            daytona.preview_token.clone(),
        )];
        let Some(url) = &daytona.preview_url else {
            // Recorded before the whole URL was kept: the host on 443.
            return Ok(tls_route(
                daytona.preview_host.clone(),
                config.proxy.as_ref(),
                config.ca_pem.clone(),
                headers,
            ));
        };
        let uri = preview_uri(url)?;
        url_route(&uri, config.proxy.as_ref(), config.ca_pem.clone(), headers).ok_or_else(|| {
            DaytonaError::Unexpected {
                what: "a preview URL",
                why: format!("{url:?} is neither http nor https"),
            }
        })
    }
}

/// A port's preview as Daytona hands it out.
struct Preview {
    /// The URL, as given.
    url: String,
    /// Its host alone.
    host: String,
    /// The token its proxy wants.
    token: String,
}

impl DaytonaRef {
    /// Keeps the agent port's preview (a start or a lapsed token changed it).
    fn keep(&mut self, preview: Preview) {
        self.preview_host = preview.host;
        self.preview_url = Some(preview.url);
        self.preview_token = preview.token;
    }
}

/// A preview URL that names a host, or the error that says it does not.
fn preview_uri(url: &str) -> Result<http::Uri, DaytonaError> {
    url.parse::<http::Uri>()
        .ok()
        .filter(|uri| uri.host().is_some_and(|host| !host.is_empty()))
        .ok_or_else(|| DaytonaError::Unexpected {
            what: "a preview URL",
            why: format!("{url:?} has no host"),
        })
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::spec::SandboxSpec;
    use silo_protocol::auth::Key;

    #[test]
    fn a_preview_url_must_name_a_host() {
        let uri = preview_uri("https://8080-abc.proxy.example:4443").unwrap();
        assert_eq!(
            uri.authority().map(|a| a.as_str()),
            Some("8080-abc.proxy.example:4443")
        );
        assert!(matches!(
            preview_uri("/no/host"),
            Err(DaytonaError::Unexpected { .. })
        ));
    }

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
            from_memory: false,
        };
        let line = start_line(&machine);
        assert!(
            line.starts_with(&format!("chmod 0755 {AGENT_PATH} && exec '{AGENT_PATH}' ")),
            "{line}"
        );
        assert!(line.ends_with(r"'sh' '-c' 'echo '\''hi'\'''"), "{line}");
    }
}
