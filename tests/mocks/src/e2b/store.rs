//! The mock's sandboxes: one record per sandbox, its lifecycle
//! (running ⇄ paused, running → snapshotting → running, killed), its
//! timeout and its egress rules.
//!
//! A record's state changes under the lock; the engine work of a change
//! (pause, unpause, remove) runs outside it, with the record marked as
//! transitioning meanwhile, so a second request sees `409` the way the real
//! API answers a sandbox that is being paused or killed. The expiry task
//! looks at every running sandbox each [`EXPIRY_TICK`] and kills it, or
//! pauses it when it was created with `autoPause`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use silo_protocol::http::error_chain;
use tokio_util::sync::CancellationToken;

use super::envd::process::ProcessTable;
use super::model::NetworkUpdate;
use super::network;
use super::{CLIENT_ID, ENVD_VERSION, Settings};
use crate::containers::{Container, ContainerError, ContainerSpec, Engine};
use crate::faults::Faults;
use crate::secret::{ALPHABET, HEX, random_text};

/// How often the expiry task looks for sandboxes past their end.
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// Where a sandbox is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Running; reachable through the proxy.
    Running,
    /// Being paused.
    Pausing,
    /// Paused (`docker pause`): memory and processes kept, frozen.
    Paused,
    /// Being resumed.
    Resuming,
    /// Running while its file system is committed to an image (a fork or
    /// a snapshot); the engine freezes it for the commit.
    Snapshotting,
    /// Being removed.
    Killing,
}

impl State {
    /// Whether the sandbox runs: running, or running while a snapshot is taken.
    pub fn runs(self) -> bool {
        matches!(self, State::Running | State::Snapshotting)
    }
}

/// One sandbox.
#[derive(Clone)]
pub struct Record {
    /// `i` + 20 characters of `[a-z0-9]`.
    pub id: String,
    /// The template id it was made from.
    pub template_id: String,
    /// The template's alias, if it has one.
    pub alias: Option<String>,
    /// When it started (or was last resumed).
    pub started_at: SystemTime,
    /// When it times out (running), or when it paused (paused).
    pub end_at: SystemTime,
    /// Its metadata.
    pub metadata: BTreeMap<String, String>,
    /// Environment of its processes.
    pub env_vars: BTreeMap<String, String>,
    /// `X-Access-Token` (secure sandboxes).
    pub envd_token: Option<String>,
    /// `e2b-traffic-access-token` (private sandboxes).
    pub traffic_token: Option<String>,
    /// Pause instead of kill on timeout.
    pub auto_pause: bool,
    /// As created (not modelled by the proxy).
    pub auto_resume: bool,
    /// As created or last updated (recorded, not enforced).
    pub allow_internet_access: Option<bool>,
    /// As created, its egress rules as last updated.
    pub network: Option<serde_json::Value>,
    /// Lifecycle state.
    pub state: State,
    /// Its container.
    pub container: Container,
    /// Processes started through envd.
    pub processes: Arc<ProcessTable>,
    /// Fires to cut every open connection to the sandbox (a pause with
    /// the drop-on-pause fault on); replaced by a fresh one then.
    pub links: CancellationToken,
    /// The proxy answers `502` until then (a resume with the unready fault on).
    pub unready_until: Option<Instant>,
}

/// A refused request: the status and the `Error` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: StatusCode,
    /// `Error.message`.
    pub message: String,
}

impl Refusal {
    /// A refusal with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The real API's answer for an unknown (or hidden) sandbox.
    pub fn not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox {id:?} doesn't exist or you don't have access to it"),
        )
    }

    fn engine(what: &str, error: &ContainerError) -> Self {
        tracing::warn!(error = %error_chain(error), "{what}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, what)
    }
}

/// What `create` needs beyond the checks of the handler.
pub struct NewRecord {
    /// Template id.
    pub template_id: String,
    /// The template's alias.
    pub alias: Option<String>,
    /// Image to make the container from.
    pub image: String,
    /// Seconds to live.
    pub timeout: Duration,
    /// The rest of the record.
    pub metadata: BTreeMap<String, String>,
    /// Environment.
    pub env_vars: BTreeMap<String, String>,
    /// Secure.
    pub secure: bool,
    /// Private (needs secure).
    pub private: bool,
    /// Auto-pause.
    pub auto_pause: bool,
    /// Auto-resume.
    pub auto_resume: bool,
    /// As sent.
    pub allow_internet_access: Option<bool>,
    /// As sent.
    pub network: Option<serde_json::Value>,
}

/// Every sandbox of one mock instance.
pub struct Store {
    records: Mutex<HashMap<String, Record>>,
    engine: Engine,
    settings: Arc<Settings>,
    faults: Arc<Faults>,
    /// The instance's token; every record's `links` is a child of it.
    cancel: CancellationToken,
}

impl Store {
    /// An empty store over `engine`, its connections ending with `cancel`.
    pub fn new(
        engine: Engine,
        settings: Arc<Settings>,
        faults: Arc<Faults>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            engine,
            settings,
            faults,
            cancel,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of one sandbox's record.
    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(id).cloned()
    }

    /// Copies of every record.
    pub fn all(&self) -> Vec<Record> {
        self.lock().values().cloned().collect()
    }

    /// Makes a sandbox: its container first, then its record.
    pub async fn create(&self, new: NewRecord) -> Result<Record, Refusal> {
        let random = |len, alphabet| {
            random_text(len, alphabet).map_err(|e| {
                tracing::warn!(error = %e, "the system's random generator failed");
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Failed to create sandbox",
                )
            })
        };
        let id = format!("i{}", random(20, ALPHABET)?);
        let envd_token = if new.secure {
            Some(random(64, HEX)?)
        } else {
            None
        };
        let traffic_token = if new.private {
            Some(random(64, HEX)?)
        } else {
            None
        };
        let spec = ContainerSpec {
            sandbox_id: &id,
            image: &new.image,
            env: new.env_vars.clone().into_iter().collect(),
            ports: &self.settings.ports,
            dirs: &super::envd::HOMES,
        };
        let container = self
            .engine
            .create(&spec)
            .await
            .map_err(|e| Refusal::engine("Failed to create sandbox", &e))?;
        let now = SystemTime::now();
        let record = Record {
            id: id.clone(),
            template_id: new.template_id,
            alias: new.alias,
            started_at: now,
            end_at: now + new.timeout,
            metadata: new.metadata,
            env_vars: new.env_vars,
            traffic_token,
            envd_token,
            auto_pause: new.auto_pause,
            auto_resume: new.auto_resume,
            allow_internet_access: new.allow_internet_access,
            network: new.network,
            state: State::Running,
            container,
            processes: Arc::new(ProcessTable::default()),
            links: self.cancel.child_token(),
            unready_until: None,
        };
        self.lock().insert(id, record.clone());
        Ok(record)
    }

    /// Pauses a running sandbox.
    pub async fn pause(&self, id: &str) -> Result<(), Refusal> {
        let container = self.begin(id, State::Pausing, |state| match state {
            State::Running => Ok(()),
            State::Paused => Err(Refusal::new(
                StatusCode::CONFLICT,
                format!("Error pausing sandbox - sandbox '{id}' is already paused"),
            )),
            other => Err(changing(id, other)),
        })?;
        match container.pause().await {
            Ok(()) => {
                let drop_links = self.faults.drop_on_pause();
                let fresh = self.cancel.child_token();
                self.finish(id, |r| {
                    r.state = State::Paused;
                    r.end_at = SystemTime::now();
                    if drop_links {
                        r.links.cancel();
                        r.links = fresh;
                    }
                });
                Ok(())
            }
            Err(error) => {
                self.finish(id, |r| r.state = State::Running);
                Err(Refusal::engine("Error pausing sandbox", &error))
            }
        }
    }

    /// Keeps a running sandbox alive for at least `timeout` (200), or
    /// resumes a paused one for `timeout` (201); the record after it.
    pub async fn connect(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Record), Refusal> {
        {
            let mut records = self.lock();
            let record = records.get_mut(id).ok_or_else(|| Refusal::not_found(id))?;
            match record.state {
                state if state.runs() => {
                    record.end_at = record.end_at.max(SystemTime::now() + timeout);
                    return Ok((StatusCode::OK, record.clone()));
                }
                State::Paused => {}
                other => return Err(changing(id, other)),
            }
        }
        let container = self.begin(id, State::Resuming, |state| match state {
            State::Paused => Ok(()),
            other => Err(changing(id, other)),
        })?;
        match container.unpause().await {
            Ok(()) => {
                let now = SystemTime::now();
                let unready_until = self.faults.unready_until(Instant::now());
                let record = self.finish(id, |r| {
                    r.state = State::Running;
                    r.started_at = now;
                    r.end_at = now + timeout;
                    r.unready_until = unready_until;
                });
                record
                    .map(|r| (StatusCode::CREATED, r))
                    .ok_or_else(|| Refusal::not_found(id))
            }
            Err(error) => {
                self.finish(id, |r| r.state = State::Paused);
                Err(Refusal::engine("Error resuming sandbox", &error))
            }
        }
    }

    /// Sets a running sandbox's end to now + `timeout` (may shorten it).
    pub fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), Refusal> {
        let mut records = self.lock();
        match records.get_mut(id) {
            Some(record) if record.state.runs() => {
                record.end_at = SystemTime::now() + timeout;
                Ok(())
            }
            Some(record) if record.state != State::Paused => Err(changing(id, record.state)),
            _ => Err(Refusal::not_found(id)),
        }
    }

    /// Replaces a running sandbox's egress rules: `404` unless it runs
    /// (a paused sandbox is not among the running ones), `409` between states.
    pub fn update_network(&self, id: &str, update: &NetworkUpdate) -> Result<(), Refusal> {
        let mut records = self.lock();
        match records.get_mut(id) {
            Some(record) if record.state == State::Running => {
                record.network = Some(network::apply(record.network.as_ref(), update));
                if update.allow_internet_access.is_some() {
                    record.allow_internet_access = update.allow_internet_access;
                }
                Ok(())
            }
            Some(record) if record.state != State::Paused => Err(changing(id, record.state)),
            _ => Err(Refusal::not_found(id)),
        }
    }

    /// Commits a sandbox's file system to an image of this instance (the
    /// engine freezes it meanwhile); `allowed` says which states may be
    /// snapshotted and how the others are refused. The image's id.
    pub async fn checkpoint(
        &self,
        id: &str,
        allowed: impl FnOnce(State) -> Result<(), Refusal>,
    ) -> Result<String, Refusal> {
        let container = self.begin(id, State::Snapshotting, allowed)?;
        let committed = self.engine.commit(&container, id).await;
        self.finish(id, |r| r.state = State::Running);
        committed.map_err(|e| Refusal::engine("Error creating snapshot", &e))
    }

    /// Removes an image this instance committed; one still in use stays.
    pub async fn remove_image(&self, image: &str) {
        if let Err(error) = self.engine.remove_image(image).await {
            tracing::debug!(%image, error = %error_chain(&error), "an image stays until shutdown");
        }
    }

    /// Kills a sandbox, running or paused: its container and its record go.
    pub async fn kill(&self, id: &str) -> Result<(), Refusal> {
        let container = self.begin(id, State::Killing, |state| match state {
            State::Killing => Err(Refusal::not_found(id)),
            State::Snapshotting => Err(changing(id, state)),
            _ => Ok(()),
        })?;
        let removed = container.remove().await;
        self.lock().remove(id);
        removed.map_err(|e| Refusal::engine("Error killing sandbox", &e))
    }

    /// Kills or pauses every running sandbox past its end, each
    /// [`EXPIRY_TICK`], until `cancel` fires.
    pub async fn expire(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(EXPIRY_TICK) => {}
            }
            let now = SystemTime::now();
            let due: Vec<(String, bool)> = self
                .lock()
                .values()
                .filter(|r| r.state == State::Running && r.end_at <= now)
                .map(|r| (r.id.clone(), r.auto_pause))
                .collect();
            for (id, auto_pause) in due {
                let outcome = if auto_pause {
                    self.pause(&id).await
                } else {
                    self.kill(&id).await
                };
                if let Err(refusal) = outcome {
                    tracing::warn!(sandbox = %id, message = %refusal.message, "timing out failed");
                }
            }
        }
    }

    /// Forgets every sandbox (shutdown; the instance removes the containers).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The `Sandbox` answer for a record.
    pub fn sandbox_json(&self, record: &Record) -> super::model::Sandbox {
        super::model::Sandbox {
            template_id: record.template_id.clone(),
            sandbox_id: record.id.clone(),
            client_id: CLIENT_ID.to_owned(),
            envd_version: ENVD_VERSION.to_owned(),
            alias: record.alias.clone(),
            envd_access_token: record.envd_token.clone(),
            traffic_access_token: record.traffic_token.clone(),
            domain: Some(self.settings.domain.clone()),
        }
    }

    /// Marks a sandbox as in `transition` if `allowed` accepts its state;
    /// returns its container for the engine work.
    pub(super) fn begin(
        &self,
        id: &str,
        transition: State,
        allowed: impl FnOnce(State) -> Result<(), Refusal>,
    ) -> Result<Container, Refusal> {
        let mut records = self.lock();
        let record = records.get_mut(id).ok_or_else(|| Refusal::not_found(id))?;
        allowed(record.state)?;
        record.state = transition;
        Ok(record.container.clone())
    }

    /// Applies the end of a transition; the record after it, if it still exists.
    pub(super) fn finish(&self, id: &str, change: impl FnOnce(&mut Record)) -> Option<Record> {
        let mut records = self.lock();
        let record = records.get_mut(id)?;
        change(record);
        Some(record.clone())
    }
}

/// The API's `utils.ShortID`: `{id}` or `{id}-{clientID}`, `[a-z0-9]+`.
pub fn short_id(composite: &str) -> Result<String, Refusal> {
    let invalid = || Refusal::new(StatusCode::BAD_REQUEST, "Invalid sandbox ID");
    let parts: Vec<&str> = composite.split('-').collect();
    if parts.len() > 2 {
        return Err(invalid());
    }
    let id = parts[0];
    let valid = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(invalid());
    }
    Ok(id.to_owned())
}

/// The real API's 409 for a sandbox between states.
pub fn changing(id: &str, state: State) -> Refusal {
    let message = match state {
        State::Killing => format!("Sandbox {id:?} is being killed"),
        State::Pausing => format!("Sandbox {id:?} is being paused"),
        State::Resuming => format!("Sandbox {id:?} is in resuming state"),
        State::Snapshotting => format!("Sandbox {id:?} is being snapshotted"),
        State::Running => format!("Sandbox {id:?} is in running state"),
        State::Paused => format!("Sandbox {id:?} is in paused state"),
    };
    Refusal::new(StatusCode::CONFLICT, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ids_strip_the_client_id() {
        assert_eq!(short_id("iabc123"), Ok("iabc123".to_owned()));
        assert_eq!(short_id("iabc123-6532622b"), Ok("iabc123".to_owned()));
        assert!(short_id("a-b-c").is_err());
        assert!(short_id("iABC").is_err());
        assert!(short_id("").is_err());
    }
}
