//! The mock's sandboxes: one record per sandbox, its lifecycle as the
//! control plane runs it (a stored state and a desired state, a pending
//! flag while the runner works), its preview token, and its activity.
//!
//! Create and start answer once the container runs, as the API waits for
//! `started` before it answers. Stop and delete answer at once with the
//! sandbox `stopping` or `destroying` and finish in the background, so a
//! client polls as it must against Daytona; a second lifecycle request
//! meanwhile is `409` "Sandbox state change in progress". A stop ends
//! every process (the container stops); a start makes a new preview token
//! and the container starts with no process but PID 1. A pause ([`pause`])
//! freezes a VM sandbox's container, and a start resumes it with its
//! processes and preview token. The tick task stops
//! a sandbox idle for `autoStopInterval` minutes (requests through the
//! proxy and open relayed connections count as activity, as the proxy
//! reports them) and deletes one stopped for `autoDeleteInterval` minutes;
//! `autoDeleteInterval = 0` deletes at stop.

pub mod pause;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use silo_protocol::http::error_chain;

pub use self::record::{
    Activity, ActivityHold, Desired, Record, SandboxClass, State, home_of, shown_state,
};
use super::Settings;
use super::network::{self, NetworkSettings};
use crate::containers::{ContainerError, ContainerSpec, Engine};
use crate::faults::Faults;
use crate::secret::{random_text, uuid_v4};

/// How often the tick task looks for idle or long-stopped sandboxes.
pub const TICK: Duration = Duration::from_millis(100);
/// How long a stop waits for PID 1 before SIGKILL (`force` waits none).
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Length of a preview token.
const TOKEN_LEN: usize = 32;
/// nanoid's alphabet lowercased, as the API makes preview tokens.
const TOKEN_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_-";

/// A refused request: the status and the message of the API's error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: StatusCode,
    /// `message`.
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

    /// `400` with `message`.
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// The API's answer for an unknown or deleted sandbox.
    pub fn not_found(id_or_name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox with ID or name {id_or_name} not found"),
        )
    }

    /// `StateChangeInProgressError`.
    pub fn in_progress() -> Self {
        Self::new(StatusCode::CONFLICT, "Sandbox state change in progress")
    }

    /// The exception filter's answer to anything unexpected.
    pub fn unexpected(what: &str, error: &dyn std::error::Error) -> Self {
        tracing::warn!(error = %error_chain(error), "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "An unexpected error occurred.",
        )
    }
}

/// What `create` needs, checked by the handler.
pub struct NewRecord {
    /// The name, if one was given.
    pub name: Option<String>,
    /// The snapshot's name.
    pub snapshot: String,
    /// The snapshot's class.
    pub sandbox_class: SandboxClass,
    /// Its image.
    pub image: String,
    /// The OS user.
    pub user: String,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Public previews.
    pub public: bool,
    /// As sent.
    pub network_block_all: bool,
    /// As sent.
    pub kvm: bool,
    /// As sent.
    pub network_allow_list: Option<String>,
    /// As sent.
    pub domain_allow_list: Option<String>,
    /// The region.
    pub target: String,
    /// Minutes.
    pub auto_stop: i64,
    /// Minutes.
    pub auto_archive: i64,
    /// Minutes.
    pub auto_delete: i64,
}

/// Every sandbox of one mock instance.
pub struct Store {
    records: Mutex<HashMap<String, Record>>,
    engine: Engine,
    settings: Arc<Settings>,
    faults: Arc<Faults>,
}

impl Store {
    /// An empty store over `engine`.
    pub fn new(engine: Engine, settings: Arc<Settings>, faults: Arc<Faults>) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            engine,
            settings,
            faults,
        }
    }

    /// Gives every sandbox a new preview token: the ones issued so far stop
    /// working, as a lapsed token does (the next preview URL carries the new one).
    pub fn lapse_preview_tokens(&self) -> Result<(), Refusal> {
        let mut records = self.lock();
        for record in records.values_mut() {
            record.auth_token = random_text(TOKEN_LEN, TOKEN_ALPHABET)
                .map_err(|e| Refusal::unexpected("making a preview token", &e))?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live sandbox with this id, else this name.
    pub fn find(&self, id_or_name: &str) -> Option<Record> {
        let records = self.lock();
        find_in(&records, id_or_name).cloned()
    }

    /// The live sandbox with this id (the proxy and the toolbox know ids only).
    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(id).cloned()
    }

    /// Copies of every live record.
    pub fn all(&self) -> Vec<Record> {
        self.lock().values().cloned().collect()
    }

    /// Forgets every sandbox (shutdown; the instance removes the containers).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Makes a sandbox: its container first, then its record, `started`.
    pub async fn create(&self, new: NewRecord) -> Result<Record, Refusal> {
        let random_failed = |e: getrandom::Error| Refusal::unexpected("making an id", &e);
        let id = uuid_v4().map_err(random_failed)?;
        let name = new.name.clone().unwrap_or_else(|| id.clone());
        let taken = |records: &HashMap<String, Record>| {
            records.values().any(|r| r.name == name).then(|| {
                Refusal::new(
                    StatusCode::CONFLICT,
                    format!("Sandbox with name {name} already exists"),
                )
            })
        };
        if let Some(refusal) = taken(&self.lock()) {
            return Err(refusal);
        }
        let auth_token = random_text(TOKEN_LEN, TOKEN_ALPHABET).map_err(random_failed)?;
        let home = home_of(&new.user);
        let spec = ContainerSpec {
            sandbox_id: &id,
            image: &new.image,
            env: new.env.clone().into_iter().collect(),
            ports: &self.settings.ports,
            dirs: &[home.as_str()],
        };
        let container = self
            .engine
            .create(&spec)
            .await
            .map_err(|e| Refusal::unexpected("creating a sandbox's container failed", &e))?;
        let now = SystemTime::now();
        let record = Record {
            id: id.clone(),
            name: name.clone(),
            snapshot: new.snapshot,
            sandbox_class: new.sandbox_class,
            user: new.user,
            env: new.env,
            labels: new.labels,
            public: new.public,
            network_block_all: new.network_block_all,
            kvm: new.kvm,
            network_allow_list: new.network_allow_list,
            domain_allow_list: new.domain_allow_list,
            target: new.target,
            auto_stop: new.auto_stop,
            auto_archive: new.auto_archive,
            auto_delete: new.auto_delete,
            state: State::Started,
            desired: Desired::Started,
            pending: false,
            error_reason: None,
            created_at: now,
            updated_at: now,
            stopped_at: None,
            auth_token,
            container: container.clone(),
            activity: Activity::new(),
            toolbox: Arc::default(),
            unready_until: None,
        };
        // Another create may have taken the name while the container started.
        let raced = {
            let mut records = self.lock();
            let refusal = taken(&records);
            if refusal.is_none() {
                records.insert(id, record.clone());
            }
            refusal
        };
        if let Some(refusal) = raced {
            container.remove().await.ok();
            return Err(refusal);
        }
        Ok(record)
    }

    /// Starts a stopped sandbox with a new preview token, or resumes a
    /// paused one with its own; answers once it runs.
    pub async fn start(&self, id_or_name: &str) -> Result<Record, Refusal> {
        let (id, container, was_paused) = {
            let mut records = self.lock();
            let record = find_in_mut(&mut records, id_or_name)
                .ok_or_else(|| Refusal::not_found(id_or_name))?;
            if record.state == State::Started && record.desired == Desired::Started {
                return Ok(record.clone());
            }
            if record.state == State::Error {
                return Err(Refusal::bad("Sandbox is in an errored state"));
            }
            if !record.desired.matches(record.state) {
                return Err(Refusal::in_progress());
            }
            if !matches!(record.state, State::Stopped | State::Paused) {
                return Err(Refusal::bad("Sandbox is not in valid state"));
            }
            if record.pending {
                return Err(Refusal::in_progress());
            }
            let was_paused = record.state == State::Paused;
            if was_paused {
                pause::check_class(record, "Resuming")?;
            } else {
                record.auth_token = random_text(TOKEN_LEN, TOKEN_ALPHABET)
                    .map_err(|e| Refusal::unexpected("making a preview token", &e))?;
            }
            record.desired = Desired::Started;
            record.pending = true;
            record.updated_at = SystemTime::now();
            (record.id.clone(), record.container.clone(), was_paused)
        };
        let unready_until = self.faults.unready_until(Instant::now());
        let (running, what) = if was_paused {
            let thawed = container.unpause().await.map(|()| container);
            (thawed, "resuming a sandbox failed")
        } else {
            (container.start().await, "starting a sandbox failed")
        };
        match running {
            Ok(running) => self
                .finish(&id, |r| {
                    r.container = running;
                    r.state = State::Started;
                    r.pending = false;
                    r.activity.touch();
                    r.unready_until = unready_until;
                })
                .ok_or_else(|| Refusal::not_found(id_or_name)),
            Err(error) => {
                self.fail(&id, &error);
                Err(Refusal::unexpected(what, &error))
            }
        }
    }

    /// Stops a started sandbox (deletes an ephemeral one); answers at once
    /// with it `stopping` (or `destroying`).
    pub fn stop(self: &Arc<Self>, id_or_name: &str, force: bool) -> Result<Record, Refusal> {
        let mut records = self.lock();
        let record =
            find_in_mut(&mut records, id_or_name).ok_or_else(|| Refusal::not_found(id_or_name))?;
        if record.state == State::Error {
            return Err(Refusal::bad("Sandbox is in an errored state"));
        }
        if !record.desired.matches(record.state) {
            return Err(Refusal::in_progress());
        }
        if !matches!(record.state, State::Started | State::Paused) {
            return Err(Refusal::bad("Sandbox is not in a stoppable state"));
        }
        if record.pending {
            return Err(Refusal::in_progress());
        }
        if record.auto_delete == 0 {
            soft_delete(record);
            let answer = record.clone();
            drop(records);
            self.finish_destroy_later(&answer);
            return Ok(answer);
        }
        record.desired = Desired::Stopped;
        record.pending = true;
        record.updated_at = SystemTime::now();
        let answer = record.clone();
        drop(records);
        let store = self.clone();
        let (id, container) = (answer.id.clone(), answer.container.clone());
        let grace = if force { Duration::ZERO } else { STOP_GRACE };
        tokio::spawn(async move {
            match container.stop(grace).await {
                Ok(()) => {
                    store.finish(&id, |r| {
                        r.state = State::Stopped;
                        r.pending = false;
                        r.stopped_at = Some(SystemTime::now());
                        r.toolbox = Arc::default();
                    });
                }
                Err(error) => store.fail(&id, &error),
            }
        });
        Ok(answer)
    }

    /// Deletes a sandbox; answers at once with it `destroying`.
    pub fn destroy(self: &Arc<Self>, id_or_name: &str) -> Result<Record, Refusal> {
        let mut records = self.lock();
        let record =
            find_in_mut(&mut records, id_or_name).ok_or_else(|| Refusal::not_found(id_or_name))?;
        if record.pending {
            return Err(Refusal::in_progress());
        }
        soft_delete(record);
        let answer = record.clone();
        drop(records);
        self.finish_destroy_later(&answer);
        Ok(answer)
    }

    /// Replaces a sandbox's labels.
    pub fn replace_labels(
        &self,
        id_or_name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Record, Refusal> {
        self.update(id_or_name, |r| r.labels = labels)
    }

    /// Replaces a sandbox's network rules, in whatever state it is.
    pub fn update_network(
        &self,
        id_or_name: &str,
        update: &NetworkSettings,
    ) -> Result<Record, Refusal> {
        self.update(id_or_name, |r| network::apply(r, update))
    }

    /// Sets a sandbox's auto-stop interval (minutes, 0: never).
    pub fn set_auto_stop(&self, id_or_name: &str, minutes: i64) -> Result<Record, Refusal> {
        if minutes < 0 {
            return Err(Refusal::bad("Auto-stop interval must be non-negative"));
        }
        self.update(id_or_name, |r| r.auto_stop = minutes)
    }

    /// Stops idle sandboxes and deletes long-stopped ones, each [`TICK`],
    /// until `cancel` fires.
    pub async fn tick(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            let minute = self.settings.minute;
            let now = SystemTime::now();
            let mut idle = Vec::new();
            let mut expired = Vec::new();
            for record in self.lock().values().filter(|r| !r.pending) {
                let minutes = |m: i64| minute.saturating_mul(u32::try_from(m).unwrap_or(u32::MAX));
                match (record.state, record.desired) {
                    (State::Started, Desired::Started)
                        if record.auto_stop > 0
                            && record.activity.idle_for(minutes(record.auto_stop)) =>
                    {
                        idle.push(record.id.clone());
                    }
                    (State::Stopped, Desired::Stopped)
                        if record.auto_delete > 0
                            && record.stopped_at.is_some_and(|at| {
                                now.duration_since(at).unwrap_or_default()
                                    >= minutes(record.auto_delete)
                            }) =>
                    {
                        expired.push(record.id.clone());
                    }
                    _ => {}
                }
            }
            for id in idle {
                if let Err(refusal) = self.stop(&id, false) {
                    tracing::debug!(sandbox = %id, message = %refusal.message, "auto-stop skipped");
                }
            }
            for id in expired {
                if let Err(refusal) = self.destroy(&id) {
                    tracing::debug!(sandbox = %id, message = %refusal.message, "auto-delete skipped");
                }
            }
        }
    }

    fn update(
        &self,
        id_or_name: &str,
        change: impl FnOnce(&mut Record),
    ) -> Result<Record, Refusal> {
        let mut records = self.lock();
        let record =
            find_in_mut(&mut records, id_or_name).ok_or_else(|| Refusal::not_found(id_or_name))?;
        change(record);
        record.updated_at = SystemTime::now();
        Ok(record.clone())
    }

    /// Removes a soft-deleted sandbox's container, then its record.
    fn finish_destroy_later(self: &Arc<Self>, record: &Record) {
        let store = self.clone();
        let (id, container) = (record.id.clone(), record.container.clone());
        tokio::spawn(async move {
            match container.remove().await {
                Ok(()) => {
                    store.lock().remove(&id);
                }
                Err(error) => store.fail(&id, &error),
            }
        });
    }

    /// Applies the end of a transition; the record after it, if it still exists.
    fn finish(&self, id: &str, change: impl FnOnce(&mut Record)) -> Option<Record> {
        let mut records = self.lock();
        let record = records.get_mut(id)?;
        change(record);
        record.updated_at = SystemTime::now();
        Some(record.clone())
    }

    /// Puts a sandbox in `error` after the engine failed it.
    fn fail(&self, id: &str, error: &ContainerError) {
        tracing::warn!(sandbox = %id, error = %error_chain(error), "a sandbox transition failed");
        self.finish(id, |r| {
            r.state = State::Error;
            r.pending = false;
            r.error_reason = Some(error_chain(error));
        });
    }
}

/// Marks a record deleted as the API's soft delete does.
fn soft_delete(record: &mut Record) {
    let millis = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    record.pending = true;
    record.desired = Desired::Destroyed;
    record.name = format!("DESTROYED_{}_{millis}", record.name);
    record.updated_at = SystemTime::now();
}

fn find_in<'a>(records: &'a HashMap<String, Record>, id_or_name: &str) -> Option<&'a Record> {
    records
        .get(id_or_name)
        .or_else(|| records.values().find(|r| r.name == id_or_name))
}

fn find_in_mut<'a>(
    records: &'a mut HashMap<String, Record>,
    id_or_name: &str,
) -> Option<&'a mut Record> {
    let id = find_in(records, id_or_name)?.id.clone();
    records.get_mut(&id)
}
