//! What one sandbox is: its record, the state the runner reached and the
//! state the control plane wants (and the state a client sees while one
//! becomes the other), its activity for auto-stop, and the `Sandbox` and
//! `SandboxListItem` answers it gives.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::containers::Container;
use crate::daytona::Settings;
use crate::daytona::model::{Sandbox, SandboxListItem, iso_millis};
use crate::daytona::toolbox::Toolbox;

/// The state the runner reached (the entity's `state` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Running.
    Started,
    /// Stopped: no process runs.
    Stopped,
    /// Paused (`docker pause`): frozen, memory and processes kept.
    Paused,
    /// The engine failed a transition; `errorReason` says how.
    Error,
}

/// Where the control plane wants the sandbox (`desiredState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Desired {
    /// Running.
    Started,
    /// Stopped.
    Stopped,
    /// Paused.
    Paused,
    /// Deleted.
    Destroyed,
}

impl State {
    /// The spelling in `SandboxState`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Started => "started",
            State::Stopped => "stopped",
            State::Paused => "paused",
            State::Error => "error",
        }
    }
}

impl Desired {
    /// The spelling in `SandboxDesiredState`.
    pub fn as_str(self) -> &'static str {
        match self {
            Desired::Started => "started",
            Desired::Stopped => "stopped",
            Desired::Paused => "paused",
            Desired::Destroyed => "destroyed",
        }
    }

    /// Whether the runner reached this goal.
    pub fn matches(self, state: State) -> bool {
        matches!(
            (self, state),
            (Desired::Started, State::Started)
                | (Desired::Stopped, State::Stopped)
                | (Desired::Paused, State::Paused)
        )
    }
}

/// The state a client sees: a transition under way shows as its own state.
pub fn shown_state(state: State, desired: Desired) -> &'static str {
    match (state, desired) {
        (State::Started | State::Paused, Desired::Stopped) => "stopping",
        (State::Started | State::Stopped | State::Paused, Desired::Destroyed) => "destroying",
        (State::Stopped, Desired::Started) => "starting",
        (State::Started, Desired::Paused) => "pausing",
        (State::Paused, Desired::Started) => "resuming",
        (state, _) => state.as_str(),
    }
}

/// What kind of machine a sandbox is (`SandboxClass`), as its snapshot
/// says; Daytona pauses and resumes only VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxClass {
    /// A container: no pause.
    Container,
    /// A Linux VM: pause keeps memory and processes.
    LinuxVm,
}

impl SandboxClass {
    /// The spelling in `SandboxClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxClass::Container => "container",
            SandboxClass::LinuxVm => "linux-vm",
        }
    }
}

/// When a sandbox was last used, as the proxy reports it.
#[derive(Debug)]
pub struct Activity {
    last: Mutex<SystemTime>,
    open: AtomicUsize,
}

/// Keeps a sandbox active while it lives (an open relayed exchange).
pub struct ActivityHold(Arc<Activity>);

impl Activity {
    /// A sandbox used now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            last: Mutex::new(SystemTime::now()),
            open: AtomicUsize::new(0),
        })
    }

    /// Records a use now.
    pub fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = SystemTime::now();
    }

    /// The last use.
    pub fn last(&self) -> SystemTime {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the sandbox in use until the hold is dropped.
    pub fn hold(self: &Arc<Self>) -> ActivityHold {
        self.touch();
        self.open.fetch_add(1, Ordering::SeqCst);
        ActivityHold(self.clone())
    }

    /// Whether nothing has used the sandbox for `idle`.
    pub fn idle_for(&self, idle: Duration) -> bool {
        self.open.load(Ordering::SeqCst) == 0
            && self.last().elapsed().is_ok_and(|elapsed| elapsed >= idle)
    }
}

impl Drop for ActivityHold {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

/// One sandbox.
#[derive(Clone)]
pub struct Record {
    /// UUID v4.
    pub id: String,
    /// Unique among live sandboxes; `DESTROYED_{name}_{ms}` once deleted.
    pub name: String,
    /// The snapshot it was made from.
    pub snapshot: String,
    /// `SandboxClass`: the snapshot's (`linux-vm` ones may pause).
    pub sandbox_class: SandboxClass,
    /// The OS user.
    pub user: String,
    /// Environment of the container.
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Previews open without a token.
    pub public: bool,
    /// As created.
    pub network_block_all: bool,
    /// As created.
    pub kvm: bool,
    /// As created.
    pub network_allow_list: Option<String>,
    /// As created.
    pub domain_allow_list: Option<String>,
    /// The region.
    pub target: String,
    /// Minutes.
    pub auto_stop: i64,
    /// Minutes.
    pub auto_archive: i64,
    /// Minutes.
    pub auto_delete: i64,
    /// Runner's state.
    pub state: State,
    /// Control plane's goal.
    pub desired: Desired,
    /// A transition is under way.
    pub pending: bool,
    /// Set in `error`.
    pub error_reason: Option<String>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Last change.
    pub updated_at: SystemTime,
    /// When it last stopped.
    pub stopped_at: Option<SystemTime>,
    /// The preview token (`x-daytona-preview-token`); new at every start
    /// but a resume.
    pub auth_token: String,
    /// Its container.
    pub container: Container,
    /// Its use, for auto-stop.
    pub activity: Arc<Activity>,
    /// The toolbox's sessions (gone with the processes at a stop).
    pub toolbox: Arc<Toolbox>,
    /// Previews answer `502` until then (a start with the unready fault on).
    pub unready_until: Option<Instant>,
}

impl Record {
    /// The state a client sees.
    pub fn shown_state(&self) -> &'static str {
        shown_state(self.state, self.desired)
    }

    /// The home directory of the sandbox's user (relative paths resolve here).
    pub fn home(&self) -> String {
        home_of(&self.user)
    }

    /// The `Sandbox` answer for this record.
    pub fn to_sandbox(&self, settings: &Settings) -> Sandbox {
        let (record, snapshot) = (self, &settings.resources);
        Sandbox {
            id: record.id.clone(),
            organization_id: settings.organization_id.clone(),
            name: record.name.clone(),
            snapshot: record.snapshot.clone(),
            user: record.user.clone(),
            env: record.env.clone(),
            labels: record.labels.clone(),
            public: record.public,
            network_block_all: record.network_block_all,
            kvm: record.kvm,
            network_allow_list: record.network_allow_list.clone(),
            domain_allow_list: record.domain_allow_list.clone(),
            target: record.target.clone(),
            cpu: snapshot.cpu,
            gpu: snapshot.gpu,
            memory: snapshot.memory,
            disk: snapshot.disk,
            state: record.shown_state(),
            desired_state: record.desired.as_str(),
            error_reason: record.error_reason.clone(),
            recoverable: false,
            backup_state: "None",
            auto_stop_interval: record.auto_stop,
            auto_pause_interval: 0,
            auto_archive_interval: record.auto_archive,
            auto_delete_interval: record.auto_delete,
            volumes: Vec::new(),
            created_at: iso_millis(record.created_at),
            updated_at: iso_millis(record.updated_at),
            last_activity_at: iso_millis(record.activity.last()),
            sandbox_class: record.sandbox_class.as_str(),
            daemon_version: None,
            runner_id: settings.runner_id.clone(),
            toolbox_proxy_url: settings.toolbox_url.clone(),
        }
    }

    /// The `SandboxListItem` for this record.
    pub fn to_list_item(&self, settings: &Settings) -> SandboxListItem {
        let full = self.to_sandbox(settings);
        SandboxListItem {
            id: full.id,
            organization_id: full.organization_id,
            name: full.name,
            target: full.target,
            runner_id: full.runner_id,
            sandbox_class: full.sandbox_class,
            state: full.state,
            desired_state: full.desired_state,
            snapshot: full.snapshot,
            user: full.user,
            error_reason: full.error_reason,
            recoverable: full.recoverable,
            public: full.public,
            network_block_all: full.network_block_all,
            network_allow_list: full.network_allow_list,
            domain_allow_list: full.domain_allow_list,
            cpu: full.cpu,
            gpu: full.gpu,
            memory: full.memory,
            disk: full.disk,
            labels: full.labels,
            backup_state: full.backup_state,
            auto_stop_interval: full.auto_stop_interval,
            auto_pause_interval: full.auto_pause_interval,
            auto_archive_interval: full.auto_archive_interval,
            auto_delete_interval: full.auto_delete_interval,
            created_at: full.created_at,
            updated_at: full.updated_at,
            last_activity_at: full.last_activity_at,
            daemon_version: full.daemon_version,
            toolbox_proxy_url: full.toolbox_proxy_url,
        }
    }
}

/// The home directory of `user`.
pub fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".to_owned()
    } else {
        format!("/home/{user}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_show_as_their_own_states() {
        assert_eq!(shown_state(State::Started, Desired::Started), "started");
        assert_eq!(shown_state(State::Started, Desired::Stopped), "stopping");
        assert_eq!(shown_state(State::Stopped, Desired::Started), "starting");
        assert_eq!(
            shown_state(State::Stopped, Desired::Destroyed),
            "destroying"
        );
        assert_eq!(
            shown_state(State::Started, Desired::Destroyed),
            "destroying"
        );
        assert_eq!(shown_state(State::Error, Desired::Stopped), "error");
        assert_eq!(shown_state(State::Started, Desired::Paused), "pausing");
        assert_eq!(shown_state(State::Paused, Desired::Paused), "paused");
        assert_eq!(shown_state(State::Paused, Desired::Started), "resuming");
        assert_eq!(shown_state(State::Paused, Desired::Stopped), "stopping");
    }

    #[test]
    fn homes_follow_the_user() {
        assert_eq!(home_of("daytona"), "/home/daytona");
        assert_eq!(home_of("root"), "/root");
    }
}
