//! One running mock, whatever the provider: its random instance id (the
//! label on every container it makes), its engine connection, a scratch
//! directory holding the test CA, its listeners and server tasks, and the
//! cleanup when it stops. [`Instance::shutdown`] stops the servers and
//! removes every container the instance made; an instance dropped without
//! it removes them too, blocking while it does.
//!
//! Each provider's `start` checks its configuration, asks an
//! [`Instance`] for listeners, the engine and a CA, and hands its
//! servers to [`Instance::serve`]; what the servers answer is its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::containers::{ContainerError, Engine};
use crate::http::{Handler, serve};
use crate::proxy::tls::{TestCa, TlsError};
use crate::secret::{ALPHABET, random_text};

/// Length of an instance id (`[a-z0-9]`).
const INSTANCE_ID_LEN: usize = 12;

/// Why a mock could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// The configuration cannot work.
    #[error("invalid mock configuration: {0}")]
    Config(String),
    /// An image a template or snapshot names is not on the engine.
    #[error(
        "{kind} {name:?} needs image {image:?}, which the engine does not have (for silo-base:latest run `silo image base`)"
    )]
    MissingImage {
        /// What names the image, in the provider's words (`template`, `snapshot`).
        kind: &'static str,
        /// Its name.
        name: String,
        /// The image.
        image: String,
    },
    /// A listener could not be bound.
    #[error("binding {addr} failed")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The scratch directory for the CA could not be made or removed.
    #[error("the state directory {path} is unusable")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The test CA could not be made.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] ContainerError),
    /// The system's random generator failed.
    #[error("the system's random generator failed: {0}")]
    Random(getrandom::Error),
}

/// The parts of a running mock every provider has.
pub struct Instance {
    kind: &'static str,
    id: String,
    engine: Engine,
    state_dir: PathBuf,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    stopped: bool,
}

impl Instance {
    /// Connects to the engine for a mock of `kind` (the container label and
    /// the state directory's name), checks that every image in `images`
    /// (name → image, called `image_kind` in messages) is there, and makes
    /// the scratch directory.
    pub async fn start(
        kind: &'static str,
        image_kind: &'static str,
        images: &BTreeMap<String, String>,
    ) -> Result<Self, MockError> {
        let id = random_text(INSTANCE_ID_LEN, ALPHABET).map_err(MockError::Random)?;
        let engine = Engine::connect(kind, &id).await?;
        for (name, image) in images {
            if !engine.has_image(image).await? {
                return Err(MockError::MissingImage {
                    kind: image_kind,
                    name: name.clone(),
                    image: image.clone(),
                });
            }
        }
        let state_dir = std::env::temp_dir().join(format!("silo-mock-{kind}-{id}"));
        std::fs::create_dir_all(&state_dir).map_err(|source| MockError::StateDir {
            path: state_dir.clone(),
            source,
        })?;
        Ok(Self {
            kind,
            id,
            engine,
            state_dir,
            cancel: CancellationToken::new(),
            tasks: Vec::new(),
            stopped: false,
        })
    }

    /// The engine, labelling containers with this instance.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Fires when the mock stops; servers and background work select on it.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Makes a test CA for `domain`, its PEM written into the scratch directory.
    pub fn test_ca(&self, domain: &str) -> Result<TestCa, MockError> {
        Ok(TestCa::generate(domain, &self.state_dir.join("ca.pem"))?)
    }

    /// Serves `handler` on `listener` (over TLS when `tls` is given) until the mock stops.
    pub fn serve<H: Handler>(
        &mut self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        handler: Arc<H>,
    ) {
        let cancel = self.cancel.clone();
        self.tasks
            .push(tokio::spawn(serve(listener, tls, handler, cancel)));
    }

    /// Runs `task` (which must end when the cancel token fires) until the mock stops.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    /// Stops the servers and tasks, removes every container of this
    /// instance and the scratch directory; returns how many containers went.
    pub async fn shutdown(mut self) -> Result<usize, MockError> {
        self.stopped = true;
        self.cancel.cancel();
        for task in self.tasks.drain(..) {
            task.await.ok();
        }
        let removed = self.engine.remove_all().await?;
        remove_state_dir(&self.state_dir)?;
        Ok(removed)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        self.cancel.cancel();
        // The caller's runtime may be shutting down, so the containers are
        // removed on a thread with a runtime and an engine connection of its own.
        let (kind, id) = (self.kind, self.id.clone());
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let removed = match Engine::connect(kind, &id).await {
                    Ok(engine) => engine.remove_all().await,
                    Err(error) => Err(error),
                };
                if let Err(error) = removed {
                    tracing::warn!(%error, "removing the mock's containers failed");
                }
            });
        });
        cleanup.join().ok();
        remove_state_dir(&self.state_dir).ok();
    }
}

/// Binds `addr` and returns the listener with the address it got.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), MockError> {
    let bind_error = |source| MockError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

fn remove_state_dir(path: &Path) -> Result<(), MockError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(MockError::StateDir {
            path: path.to_path_buf(),
            source,
        }),
    }
}
