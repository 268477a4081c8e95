//! A mock of the Kubernetes API server, for what a sandbox controller
//! uses: pods that are real Docker containers running their real command,
//! Secrets, NetworkPolicies (recorded, not enforced), watches, exec and
//! port-forward (WebSocket channels, and SPDY as kubectl speaks it). The
//! API is followed field for field as `k8s-openapi` (API version 1.33)
//! types it: every object, list, event and `Status` is serialized by its
//! types.
//!
//! [`MockKubernetes::start`] serves HTTPS on 127.0.0.1 (a certificate from
//! the test CA for `127.0.0.1` and `localhost`), accepting one bearer
//! token, and writes a kubeconfig naming it all into its scratch
//! directory ([`MockKubernetes::kubeconfig_path`], or `KUBECONFIG=` from
//! [`MockKubernetes::env`]). Each pod gets its own loopback address
//! ([`addresses`]) with its container ports published there.
//! [`MockKubernetes::shutdown`] removes every container and the scratch
//! directory; a mock dropped without it removes them too.
//!
//! Layout: [`api`] routes; [`discovery`]; [`pods`] (with [`admission`]
//! for its checks and defaults, [`kubelet`] for a pod's life and [`pod_status`] for what it reports, [`runtime`] for its containers, [`volumes`] for
//! `emptyDir` and `secret` volumes); [`objects`] with [`secrets`] and
//! [`policies`]; [`namespaces`]; [`watch`]; [`exec`] and [`portforward`]
//! (with [`upgrade`] and [`spdy`]);
//! [`store`] (objects, resource versions, events); [`selectors`];
//! [`table`] (kubectl's server-side printing); [`status`]; [`model`];
//! [`quantity`]; [`kubeconfig`].

pub mod addresses;
pub mod admission;
pub mod api;
pub mod discovery;
pub mod exec;
pub mod kubeconfig;
pub mod kubelet;
pub mod model;
pub mod namespaces;
pub mod objects;
pub mod pod_status;
pub mod pods;
pub mod policies;
pub mod portforward;
pub mod quantity;
pub mod runtime;
pub mod secrets;
pub mod selectors;
pub mod spdy;
pub mod status;
pub mod store;
pub mod table;
pub mod upgrade;
pub mod volumes;
pub mod watch;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::addresses::AddressBlock;
use self::api::Api;
pub use self::store::PodContainers;
use self::store::Store;
use crate::containers::Engine;
pub use crate::instance::MockError;
use crate::instance::{Instance, bind};
use crate::secret::{HEX, random_text};

/// The label value naming Kubernetes mocks' containers.
pub const MOCK_KIND: &str = "kubernetes";
/// Environment variable: the kubeconfig clients load.
pub const ENV_KUBECONFIG: &str = "KUBECONFIG";
/// The kubeconfig context's namespace.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The test certificate's domain (it also names `localhost` and `127.0.0.1`).
pub const TLS_DOMAIN: &str = "kubernetes.test";
/// Hex digits of a random token.
const TOKEN_LEN: usize = 48;
/// The kubeconfig's file name in the scratch directory.
const KUBECONFIG_FILE: &str = "kubeconfig";

/// How to start the mock.
#[derive(Debug, Clone)]
pub struct MockKubernetesConfig {
    /// The bearer token clients must send; random when `None`.
    pub token: Option<String>,
    /// Where the API listens (`127.0.0.1:0`: any free port).
    pub api_addr: SocketAddr,
}

impl Default for MockKubernetesConfig {
    fn default() -> Self {
        Self {
            token: None,
            api_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        }
    }
}

/// What the API server and the kubelets share.
pub struct Cluster {
    /// Every object.
    pub store: Store,
    /// The engine, labelling containers with this instance.
    pub engine: Engine,
    /// This instance's pod addresses.
    pub addresses: AddressBlock,
    /// Where pods' volumes live (`{scratch}/pods/{uid}`).
    pub pods_dir: PathBuf,
    /// Whether the engine has the `runsc` runtime.
    pub runsc: bool,
    /// Fires when the mock stops.
    pub cancel: CancellationToken,
    /// The API's address (discovery reports it).
    pub api_addr: SocketAddr,
    /// When the mock started (namespaces' creation time).
    pub started: Time,
    /// One permit per exec session running ([`exec::MAX_EXECS`]).
    pub execs: Arc<Semaphore>,
    kubelets: Mutex<JoinSet<()>>,
}

impl Cluster {
    /// Runs a pod's kubelet task until it ends or the mock stops.
    pub fn spawn_kubelet(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut kubelets = self.kubelets.lock().unwrap_or_else(|p| p.into_inner());
        while kubelets.try_join_next().is_some() {}
        kubelets.spawn(task);
    }

    /// Waits for every kubelet task (after the cancel token fired).
    async fn join_kubelets(&self) {
        let mut kubelets = {
            let mut guard = self.kubelets.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *guard)
        };
        while kubelets.join_next().await.is_some() {}
    }
}

/// A running mock Kubernetes.
pub struct MockKubernetes {
    cluster: Arc<Cluster>,
    api_url: String,
    token: String,
    kubeconfig: PathBuf,
    ca_pem: PathBuf,
    instance: Instance,
}

impl MockKubernetes {
    /// Starts the API server and writes the kubeconfig.
    pub async fn start(config: MockKubernetesConfig) -> Result<Self, MockError> {
        let token = match config.token {
            Some(token)
                if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c == '"') =>
            {
                return Err(MockError::Config(
                    "the token must be non-empty, without spaces or quotes".to_owned(),
                ));
            }
            Some(token) => token,
            None => random_text(TOKEN_LEN, HEX).map_err(MockError::Random)?,
        };
        let mut instance = Instance::start(MOCK_KIND, "image", &BTreeMap::new()).await?;
        let ca = instance.test_ca(TLS_DOMAIN)?;
        let scratch = ca
            .pem_path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let (listener, api_addr) = bind(config.api_addr).await?;
        let addresses = AddressBlock::claim().map_err(|e| MockError::Config(e.to_string()))?;
        let runsc = runtime::has_runsc(instance.engine()).await;
        let pods_dir = scratch.join("pods");
        let state_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MockError::StateDir { path, source }
        };
        std::fs::create_dir_all(&pods_dir).map_err(state_error(&pods_dir))?;
        let api_url = format!("https://{api_addr}");
        let ca_bytes = std::fs::read(ca.pem_path()).map_err(state_error(ca.pem_path()))?;
        let kubeconfig = scratch.join(KUBECONFIG_FILE);
        let text = kubeconfig::render(&api_url, &ca_bytes, &token, DEFAULT_NAMESPACE);
        kubeconfig::write(&kubeconfig, &text).map_err(state_error(&kubeconfig))?;

        let cluster = Arc::new(Cluster {
            store: Store::default(),
            engine: instance.engine().clone(),
            addresses,
            pods_dir,
            runsc,
            cancel: instance.cancel_token(),
            api_addr,
            started: model::now(),
            execs: Arc::new(Semaphore::new(exec::MAX_EXECS)),
            kubelets: Mutex::new(JoinSet::new()),
        });
        let api = Arc::new(Api {
            cluster: cluster.clone(),
            token: token.clone(),
        });
        instance.serve(listener, Some(ca.acceptor()), api);
        Ok(Self {
            cluster,
            api_url,
            token,
            kubeconfig,
            ca_pem: ca.pem_path().to_path_buf(),
            instance,
        })
    }

    /// The API's base URL (`https://127.0.0.1:PORT`).
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The bearer token the API accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The kubeconfig the mock wrote (cluster, user with the token, context
    /// with namespace `default`, current context set).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The PEM file of the CA that signed the API's certificate.
    pub fn ca_pem_path(&self) -> &Path {
        &self.ca_pem
    }

    /// Whether pods asking for `runtimeClassName` `runsc`/`gvisor` run under
    /// the engine's `runsc` runtime (the engine has one).
    pub fn runs_gvisor(&self) -> bool {
        self.cluster.runsc
    }

    /// Every pod's containers on the engine (ids, init containers first),
    /// with the pod's address and uid.
    pub fn pods(&self) -> Vec<PodContainers> {
        self.cluster.store.pod_containers()
    }

    /// The environment a client needs: `KUBECONFIG`.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![(
            ENV_KUBECONFIG.to_owned(),
            self.kubeconfig.display().to_string(),
        )]
    }

    /// Stops the server and every pod; removes their containers and the
    /// scratch directory. Returns how many containers were removed.
    pub async fn shutdown(self) -> Result<usize, MockError> {
        self.cluster.cancel.cancel();
        self.cluster.join_kubelets().await;
        self.instance.shutdown().await
    }
}
