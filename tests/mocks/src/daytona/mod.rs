//! A mock of Daytona, following the current generated clients and the
//! last published repository (daytonaio/daytona, June 2026) for what they
//! leave out: its control plane ([`api`],
//! plain HTTP under `/api`), its proxy ([`gateway`], HTTPS with a test
//! CA, serving previews and the toolbox by host) and the toolbox daemon
//! ([`toolbox`], served by the mock for each sandbox), with every sandbox a
//! real Docker container ([`crate::containers`]) and its lifecycle in
//! [`store`].
//!
//! [`MockDaytona::start`] brings all of it up on 127.0.0.1. A client
//! reaches the control plane at [`MockDaytona::api_url`] and the proxy at
//! [`MockDaytona::proxy_addr`] for any `*.{proxyDomain}` host: previews
//! are `https://{port}-{sandboxId}.{proxyDomain}`, the toolbox is
//! [`MockDaytona::toolbox_url`] (`https://proxy.{proxyDomain}/toolbox`),
//! both trusting the CA at [`MockDaytona::ca_pem_path`].
//! [`MockDaytona::shutdown`] removes every container the instance made; a
//! mock dropped without it removes them too, blocking while it does.

pub mod api;
pub mod create;
pub mod gateway;
pub mod list;
pub mod model;
pub mod network;
pub mod reply;
pub mod routes;
pub mod store;
pub mod toolbox;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use self::api::{API_PREFIX, Api};
use self::gateway::{Gateway, TOOLBOX_PORT};
use self::store::Store;
use crate::faults::Faults;
use crate::instance::{Instance, MockError, bind};
use crate::journal::{Asked, Journal};
use crate::secret::{HEX, random_text, uuid_v4};

/// The port silo's agent listens on in a sandbox; published by default.
pub const AGENT_PORT: u16 = 49999;
/// The snapshot every default configuration has (and uses when a create names none).
pub const DEFAULT_SNAPSHOT: (&str, &str) = ("base", "silo-base:latest");
/// The proxy domain unless configured.
pub const DEFAULT_PROXY_DOMAIN: &str = "daytona.test";
/// The region unless configured.
pub const DEFAULT_TARGET: &str = "us";
/// The first label of the toolbox's host (`proxy.{proxyDomain}`).
pub const TOOLBOX_HOST_LABEL: &str = "proxy";
/// What a random API key starts with (Daytona's keys do; any key works).
pub const API_KEY_PREFIX: &str = "dtn_";
/// The label value naming Daytona mocks' containers.
pub const MOCK_KIND: &str = "daytona";

/// Environment variable: the API key (Daytona SDKs read it).
pub const ENV_API_KEY: &str = "DAYTONA_API_KEY";
/// Environment variable: the control plane's URL, `/api` included (Daytona SDKs read it).
pub const ENV_API_URL: &str = "DAYTONA_API_URL";
/// Environment variable: the region (Daytona SDKs read it).
pub const ENV_TARGET: &str = "DAYTONA_TARGET";
/// Environment variable: where to connect for any `*.{proxyDomain}` host,
/// the toolbox's included.
pub const ENV_PROXY_ADDR: &str = "SILO_DAYTONA_PROXY_ADDR";
/// Environment variable: the PEM file of the CA to trust for the proxy.
pub const ENV_CA_PEM: &str = "SILO_DAYTONA_CA_PEM";

/// How to start the mock.
#[derive(Debug, Clone)]
pub struct MockDaytonaConfig {
    /// Snapshot name → Docker image (must be on the engine).
    pub snapshots: BTreeMap<String, String>,
    /// The snapshot a create without one gets (must be in `snapshots`).
    pub default_snapshot: String,
    /// Snapshots (among `snapshots`) whose sandboxes are `linux-vm`, the
    /// class Daytona pauses and resumes; the others are `container`.
    pub vm_snapshots: BTreeSet<String>,
    /// The API key clients must send; a random `dtn_…` one when `None`.
    pub api_key: Option<String>,
    /// The proxy domain: previews are `{port}-{id}.{domain}`.
    pub proxy_domain: String,
    /// The toolbox's host in `toolboxProxyUrl`; `proxy.{domain}` when
    /// `None` (a self-hosted Daytona names its own, e.g. `localhost`).
    pub toolbox_host: Option<String>,
    /// The regions a create may name; the first is the default.
    pub targets: Vec<String>,
    /// Container ports published for previews (never 2280, the toolbox's).
    pub ports: Vec<u16>,
    /// Where the control plane listens (`127.0.0.1:0`: any free port).
    pub api_addr: SocketAddr,
    /// Where the proxy listens.
    pub proxy_addr: SocketAddr,
    /// How long one minute of `autoStopInterval` and `autoDeleteInterval`
    /// lasts (tests shorten it).
    pub minute: Duration,
}

impl Default for MockDaytonaConfig {
    fn default() -> Self {
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        Self {
            snapshots: BTreeMap::from([(
                DEFAULT_SNAPSHOT.0.to_owned(),
                DEFAULT_SNAPSHOT.1.to_owned(),
            )]),
            default_snapshot: DEFAULT_SNAPSHOT.0.to_owned(),
            vm_snapshots: BTreeSet::new(),
            api_key: None,
            proxy_domain: DEFAULT_PROXY_DOMAIN.to_owned(),
            toolbox_host: None,
            targets: vec![DEFAULT_TARGET.to_owned()],
            ports: vec![AGENT_PORT],
            api_addr: loopback,
            proxy_addr: loopback,
            minute: Duration::from_secs(60),
        }
    }
}

/// The resources every sandbox reports (the snapshot's; not enforced).
#[derive(Debug, Clone, Copy)]
pub struct Resources {
    /// vCPUs.
    pub cpu: u32,
    /// GPUs.
    pub gpu: u32,
    /// GiB of memory.
    pub memory: u32,
    /// GiB of disk.
    pub disk: u32,
}

/// Daytona's default sandbox size.
pub const RESOURCES: Resources = Resources {
    cpu: 1,
    gpu: 0,
    memory: 1,
    disk: 3,
};

/// What the servers share, fixed at start.
#[derive(Debug)]
pub struct Settings {
    /// The one valid API key.
    pub api_key: String,
    /// The organization every sandbox belongs to.
    pub organization_id: String,
    /// The one runner every sandbox is on.
    pub runner_id: String,
    /// The proxy domain.
    pub proxy_domain: String,
    /// `:{port}` after every proxy host in a URL, when the proxy is not
    /// on 443 (as a Daytona whose proxy domain carries a port writes them).
    pub port_suffix: String,
    /// The toolbox's host.
    pub toolbox_host: String,
    /// `toolboxProxyUrl`.
    pub toolbox_url: String,
    /// Snapshot → image.
    pub snapshots: BTreeMap<String, String>,
    /// The snapshot a create without one gets.
    pub default_snapshot: String,
    /// Snapshots whose sandboxes are VMs.
    pub vm_snapshots: BTreeSet<String>,
    /// Regions; the first is the default.
    pub targets: Vec<String>,
    /// Published container ports.
    pub ports: Vec<u16>,
    /// One minute of the lifecycle intervals.
    pub minute: Duration,
    /// What every sandbox reports.
    pub resources: Resources,
}

impl Settings {
    /// The region a create without `target` gets.
    pub fn default_target(&self) -> &str {
        self.targets
            .first()
            .map(String::as_str)
            .unwrap_or(DEFAULT_TARGET)
    }

    /// The host (and TLS server name) of a sandbox's port.
    pub fn preview_host(&self, port: u16, sandbox_id: &str) -> String {
        format!("{port}-{sandbox_id}.{}", self.proxy_domain)
    }

    /// The preview URL of a sandbox's port.
    pub fn preview_url(&self, port: u16, sandbox_id: &str) -> String {
        format!(
            "https://{}{}",
            self.preview_host(port, sandbox_id),
            self.port_suffix
        )
    }
}

/// A running mock Daytona.
pub struct MockDaytona {
    settings: Arc<Settings>,
    api_url: String,
    proxy_addr: SocketAddr,
    ca_pem: PathBuf,
    store: Arc<Store>,
    faults: Arc<Faults>,
    journal: Arc<Journal>,
    instance: Instance,
}

impl MockDaytona {
    /// Checks `config`, then starts the control plane, the proxy and the
    /// lifecycle tick.
    pub async fn start(config: MockDaytonaConfig) -> Result<Self, MockError> {
        let random = |len, alphabet| random_text(len, alphabet).map_err(MockError::Random);
        let api_key = match config.api_key {
            Some(key) if key.trim().is_empty() => {
                return Err(MockError::Config("the api key is empty".into()));
            }
            Some(key) => key,
            None => format!("{API_KEY_PREFIX}{}", random(64, HEX)?),
        };
        if !config.snapshots.contains_key(&config.default_snapshot) {
            return Err(MockError::Config(format!(
                "the default snapshot {:?} is not among the snapshots",
                config.default_snapshot
            )));
        }
        if let Some(unknown) = config
            .vm_snapshots
            .iter()
            .find(|s| !config.snapshots.contains_key(*s))
        {
            return Err(MockError::Config(format!(
                "the VM snapshot {unknown:?} is not among the snapshots"
            )));
        }
        if config.targets.is_empty() {
            return Err(MockError::Config("no target (region) is configured".into()));
        }
        if config.ports.contains(&TOOLBOX_PORT) {
            return Err(MockError::Config(format!(
                "port {TOOLBOX_PORT} is the toolbox's, served by the mock; it cannot be published"
            )));
        }
        if config.minute.is_zero() {
            return Err(MockError::Config("a minute cannot last zero time".into()));
        }
        let mut instance = Instance::start(MOCK_KIND, "snapshot", &config.snapshots).await?;
        let ca = instance.test_ca(&config.proxy_domain)?;
        let (api_listener, api_addr) = bind(config.api_addr).await?;
        let (proxy_listener, proxy_addr) = bind(config.proxy_addr).await?;

        let port_suffix = match proxy_addr.port() {
            443 => String::new(),
            port => format!(":{port}"),
        };
        let toolbox_host = config
            .toolbox_host
            .unwrap_or_else(|| format!("{TOOLBOX_HOST_LABEL}.{}", config.proxy_domain));
        let settings = Arc::new(Settings {
            api_key,
            organization_id: uuid_v4().map_err(MockError::Random)?,
            runner_id: uuid_v4().map_err(MockError::Random)?,
            toolbox_url: format!("https://{toolbox_host}{port_suffix}/toolbox"),
            toolbox_host,
            port_suffix,
            proxy_domain: config.proxy_domain,
            snapshots: config.snapshots,
            default_snapshot: config.default_snapshot,
            vm_snapshots: config.vm_snapshots,
            targets: config.targets,
            ports: config.ports,
            minute: config.minute,
            resources: RESOURCES,
        });
        let faults = Arc::new(Faults::default());
        let store = Arc::new(Store::new(
            instance.engine().clone(),
            settings.clone(),
            faults.clone(),
        ));
        let journal = Arc::new(Journal::default());
        let api = Arc::new(Api {
            store: store.clone(),
            settings: settings.clone(),
            faults: faults.clone(),
            journal: journal.clone(),
        });
        let gateway = Arc::new(Gateway {
            store: store.clone(),
            settings: settings.clone(),
            faults: faults.clone(),
            cancel: instance.cancel_token(),
        });
        instance.serve(api_listener, None, api);
        instance.serve(proxy_listener, Some(ca.acceptor()), gateway);
        instance.spawn(store.clone().tick(instance.cancel_token()));
        Ok(Self {
            settings,
            api_url: format!("http://{api_addr}{API_PREFIX}"),
            proxy_addr,
            ca_pem: ca.pem_path().to_path_buf(),
            store,
            faults,
            journal,
            instance,
        })
    }

    /// The control plane's base URL (`http://127.0.0.1:PORT/api`).
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The API key the control plane and the proxy accept.
    pub fn api_key(&self) -> &str {
        &self.settings.api_key
    }

    /// The region a create without `target` gets.
    pub fn target(&self) -> &str {
        self.settings.default_target()
    }

    /// The organization of the API key (every sandbox's `organizationId`).
    pub fn organization_id(&self) -> &str {
        &self.settings.organization_id
    }

    /// The proxy domain.
    pub fn proxy_domain(&self) -> &str {
        &self.settings.proxy_domain
    }

    /// `toolboxProxyUrl`: `https://proxy.{proxyDomain}:{proxyPort}/toolbox`
    /// (the configured toolbox host in place of `proxy.{proxyDomain}`).
    pub fn toolbox_url(&self) -> &str {
        &self.settings.toolbox_url
    }

    /// The toolbox's host (and TLS server name).
    pub fn toolbox_host(&self) -> String {
        self.settings.toolbox_host.clone()
    }

    /// The proxy's address: connect here for any `*.{proxyDomain}` host.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// The PEM file of the CA that signed the proxy's certificate.
    pub fn ca_pem_path(&self) -> &Path {
        &self.ca_pem
    }

    /// The host (and TLS server name) of a sandbox's port.
    pub fn preview_host(&self, port: u16, sandbox_id: &str) -> String {
        self.settings.preview_host(port, sandbox_id)
    }

    /// The switches of what a real Daytona does that the mock otherwise
    /// does not show (also reachable on the control plane's test-only route).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Makes every preview token issued so far stop working, as lapsed
    /// tokens do; the next preview URL of a sandbox carries a new one.
    pub fn lapse_preview_tokens(&self) -> Result<(), MockError> {
        self.store
            .lapse_preview_tokens()
            .map_err(|refusal| MockError::Config(refusal.message))
    }

    /// Every control-plane request past the key check so far (the last
    /// [`crate::journal::MAX_RECORDED`]), oldest first: what a client asked.
    pub fn requests(&self) -> Vec<Asked> {
        self.journal.all()
    }

    /// The environment a client needs, as `(name, value)` pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_API_KEY, self.settings.api_key.clone()),
            (ENV_API_URL, self.api_url.clone()),
            (ENV_TARGET, self.target().to_owned()),
            (ENV_PROXY_ADDR, self.proxy_addr.to_string()),
            (ENV_CA_PEM, self.ca_pem.display().to_string()),
        ]
    }

    /// Stops the servers and removes every container this instance made;
    /// returns how many were removed.
    pub async fn shutdown(self) -> Result<usize, MockError> {
        self.store.clear();
        self.instance.shutdown().await
    }
}
