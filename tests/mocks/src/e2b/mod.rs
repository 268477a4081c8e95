//! A mock of E2B: its control plane ([`api`], plain HTTP), its sandbox
//! proxy ([`gateway`], HTTPS with a test CA) and envd ([`envd`], served by
//! the mock for each sandbox on port 49983), with every sandbox a real
//! Docker container ([`crate::containers`]) and its lifecycle in [`store`];
//! forks and snapshots ([`fork`], [`snapshots`], [`templates`]) are images
//! committed from a sandbox's container, egress rules ([`network`]) are
//! checked and recorded.
//!
//! [`MockE2b::start`] brings all of it up on 127.0.0.1; a client reaches
//! the control plane at [`MockE2b::api_url`] and every sandbox port at
//! [`MockE2b::proxy_addr`], with TLS server name
//! `{port}-{sandboxID}.{domain}` and the CA at [`MockE2b::ca_pem_path`].
//! [`MockE2b::shutdown`] removes every container the instance made; a mock
//! dropped without it removes them too, blocking while it does.

pub mod api;
pub mod create;
pub mod envd;
pub mod fork;
pub mod gateway;
pub mod list;
pub mod model;
pub mod network;
pub mod snapshots;
pub mod store;
pub mod templates;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::api::{API_KEY_PREFIX, Api};
use self::gateway::Gateway;
use self::store::Store;
use self::templates::Templates;
use crate::faults::Faults;
pub use crate::instance::MockError;
use crate::instance::{Instance, bind};
use crate::journal::{Asked, Journal};
use crate::secret::{HEX, random_text};

/// envd's port in every sandbox (served by the mock, never published).
pub const ENVD_PORT: u16 = 49983;
/// The port silo's agent listens on in an E2B sandbox; published by default.
pub const AGENT_PORT: u16 = 49999;
/// The deprecated `clientID` every `Sandbox` carries.
pub const CLIENT_ID: &str = "6532622b";
/// The envd version sandboxes report: the first with raw-body uploads,
/// the newest feature the mock's envd models.
pub const ENVD_VERSION: &str = "0.5.7";
/// The sandbox domain unless configured.
pub const DEFAULT_DOMAIN: &str = "e2b.test";
/// The template every default configuration has.
pub const DEFAULT_TEMPLATE: (&str, &str) = ("base", "silo-base:latest");
/// The label value naming E2B mocks' containers.
pub const MOCK_KIND: &str = "e2b";

/// Environment variable: the control plane's URL (E2B SDKs read it).
pub const ENV_API_URL: &str = "E2B_API_URL";
/// Environment variable: the API key (E2B SDKs read it).
pub const ENV_API_KEY: &str = "E2B_API_KEY";
/// Environment variable: the sandbox domain (E2B SDKs read it).
pub const ENV_DOMAIN: &str = "E2B_DOMAIN";
/// Environment variable: where to connect for any `*.{domain}` host.
pub const ENV_PROXY_ADDR: &str = "SILO_E2B_PROXY_ADDR";
/// Environment variable: the PEM file of the CA to trust for the proxy.
pub const ENV_CA_PEM: &str = "SILO_E2B_CA_PEM";

/// How to start the mock.
#[derive(Debug, Clone)]
pub struct MockE2bConfig {
    /// Template id → Docker image (must be on the engine).
    pub templates: BTreeMap<String, String>,
    /// The API key clients must send; a random `e2b_…` one when `None`.
    pub api_key: Option<String>,
    /// The sandbox domain.
    pub domain: String,
    /// Container ports published for the proxy (never 49983).
    pub ports: Vec<u16>,
    /// Where the control plane listens (`127.0.0.1:0`: any free port).
    pub api_addr: SocketAddr,
    /// Where the proxy listens.
    pub proxy_addr: SocketAddr,
    /// Which generations of the create and connect routes it serves (an
    /// older or a newer E2B than the current one; both by default).
    pub routes: Generations,
}

/// The generations of the create and connect routes a mock serves: v1
/// (`POST /sandboxes`, `/sandboxes/{id}/connect`) and v2
/// (`POST /v2/sandboxes`, `/v2/sandboxes/{id}/connect`). One left out
/// answers `404` as a route the API does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generations {
    /// Serve the v1 routes.
    pub v1: bool,
    /// Serve the v2 routes.
    pub v2: bool,
}

impl Default for Generations {
    fn default() -> Self {
        Self { v1: true, v2: true }
    }
}

impl Default for MockE2bConfig {
    fn default() -> Self {
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        Self {
            templates: BTreeMap::from([(
                DEFAULT_TEMPLATE.0.to_owned(),
                DEFAULT_TEMPLATE.1.to_owned(),
            )]),
            api_key: None,
            domain: DEFAULT_DOMAIN.to_owned(),
            ports: vec![AGENT_PORT],
            api_addr: loopback,
            proxy_addr: loopback,
            routes: Generations::default(),
        }
    }
}

/// What the servers share, fixed at start.
#[derive(Debug)]
pub struct Settings {
    /// The sandbox domain.
    pub domain: String,
    /// The one valid API key.
    pub api_key: String,
    /// Template id → image.
    pub templates: BTreeMap<String, String>,
    /// Published container ports.
    pub ports: Vec<u16>,
    /// The create and connect routes served.
    pub routes: Generations,
}

/// A running mock E2B.
pub struct MockE2b {
    settings: Arc<Settings>,
    api_url: String,
    proxy_addr: SocketAddr,
    ca_pem: PathBuf,
    store: Arc<Store>,
    faults: Arc<Faults>,
    journal: Arc<Journal>,
    instance: Instance,
}

impl MockE2b {
    /// Checks `config`, then starts the control plane, the proxy and the
    /// expiry task.
    pub async fn start(config: MockE2bConfig) -> Result<Self, MockError> {
        let api_key = match config.api_key {
            Some(key) if !key.starts_with(API_KEY_PREFIX) => {
                return Err(MockError::Config(format!(
                    "the api key must start with {API_KEY_PREFIX:?}"
                )));
            }
            Some(key) => key,
            None => format!(
                "{API_KEY_PREFIX}{}",
                random_text(40, HEX).map_err(MockError::Random)?
            ),
        };
        if config.templates.is_empty() {
            return Err(MockError::Config("no template is configured".into()));
        }
        if config.ports.contains(&ENVD_PORT) {
            return Err(MockError::Config(format!(
                "port {ENVD_PORT} is envd's, served by the mock; it cannot be published"
            )));
        }
        let mut instance = Instance::start(MOCK_KIND, "template", &config.templates).await?;
        let ca = instance.test_ca(&config.domain)?;
        let (api_listener, api_addr) = bind(config.api_addr).await?;
        let (proxy_listener, proxy_addr) = bind(config.proxy_addr).await?;

        let settings = Arc::new(Settings {
            domain: config.domain,
            api_key,
            templates: config.templates,
            ports: config.ports,
            routes: config.routes,
        });
        let faults = Arc::new(Faults::default());
        let store = Arc::new(Store::new(
            instance.engine().clone(),
            settings.clone(),
            faults.clone(),
            instance.cancel_token(),
        ));
        let journal = Arc::new(Journal::default());
        let api = Arc::new(Api {
            store: store.clone(),
            templates: Arc::new(Templates::new(settings.templates.clone())),
            settings: settings.clone(),
            faults: faults.clone(),
            journal: journal.clone(),
            idempotency: Default::default(),
        });
        let gateway = Arc::new(Gateway {
            store: store.clone(),
            api: api.clone(),
            settings: settings.clone(),
            cancel: instance.cancel_token(),
        });
        instance.serve(api_listener, None, api);
        instance.serve(proxy_listener, Some(ca.acceptor()), gateway);
        instance.spawn(store.clone().expire(instance.cancel_token()));
        Ok(Self {
            settings,
            api_url: format!("http://{api_addr}"),
            proxy_addr,
            ca_pem: ca.pem_path().to_path_buf(),
            store,
            faults,
            journal,
            instance,
        })
    }

    /// The control plane's base URL (`http://127.0.0.1:PORT`).
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The API key the control plane accepts.
    pub fn api_key(&self) -> &str {
        &self.settings.api_key
    }

    /// The sandbox domain.
    pub fn domain(&self) -> &str {
        &self.settings.domain
    }

    /// The proxy's address: connect here for any `*.{domain}` host.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// The PEM file of the CA that signed the proxy's certificate.
    pub fn ca_pem_path(&self) -> &Path {
        &self.ca_pem
    }

    /// The host (and TLS server name) of a sandbox's port.
    pub fn sandbox_host(&self, port: u16, sandbox_id: &str) -> String {
        format!("{port}-{sandbox_id}.{}", self.settings.domain)
    }

    /// The switches of what a real E2B does that the mock otherwise does
    /// not show (also reachable on the control plane's test-only route).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Every control-plane request routed so far (the last
    /// [`crate::journal::MAX_RECORDED`]), oldest first: what a client asked.
    pub fn requests(&self) -> Vec<Asked> {
        self.journal.all()
    }

    /// The environment a client needs, as `(name, value)` pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_API_URL, self.api_url.clone()),
            (ENV_API_KEY, self.settings.api_key.clone()),
            (ENV_DOMAIN, self.settings.domain.clone()),
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
