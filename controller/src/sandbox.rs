//! [`Sandbox`]: the handle a harness holds on one sandbox, with its
//! commands, files and snapshots, the shape E2B and Daytona SDK users know.
//!
//! A handle is what [`Silo::up`] and [`Silo::sandbox`] answer. It is cheap
//! to clone and owns what it needs (a [`Silo`] clone and the sandbox's
//! agent client), so each task of a harness can hold one. It does not keep
//! the sandbox alive or running: another process may stop or remove it, and
//! the next call then says so.

mod address;
mod commands;
mod files;
mod snapshots;

use std::time::Duration;

use silo_protocol::bundle::FileSet;

pub use address::AgentAddress;
pub use commands::{CommandEvent, CommandOutput, Commands, Execution};
pub use files::{Copied, CopyError, FileError, FileStream, Files};
pub use snapshots::Snapshots;

use crate::PortUrl;
use crate::push::{PushError, PushOptions, PushReport};
use crate::state::SandboxRecord;
use crate::{Silo, SiloError, UpOutcome, UpRequest};

/// One sandbox, ready to use.
#[derive(Debug, Clone)]
pub struct Sandbox {
    silo: Silo,
    record: SandboxRecord,
    commands: Commands,
    files: Files,
}

impl Sandbox {
    fn new(silo: Silo, record: SandboxRecord) -> Result<Self, SiloError> {
        let client = silo.client(&record)?;
        Ok(Self {
            commands: Commands::new(client.clone()),
            files: Files::new(client),
            silo,
            record,
        })
    }

    /// Its stable id (`sbx-…`).
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.record.name
    }

    /// What the state database recorded of it when this handle was made.
    pub fn record(&self) -> &SandboxRecord {
        &self.record
    }

    /// Running commands and shell sessions.
    pub fn commands(&self) -> &Commands {
        &self.commands
    }

    /// Reading and writing files.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Why this sandbox cannot be reached, if it is down: removed (by this
    /// process or another), stopped, or its machine gone or replaced since
    /// this handle was made. `None` when its machine runs. For a caller
    /// whose request found no agent, to say what happened instead.
    pub async fn down(&self) -> Option<SiloError> {
        self.silo.down(&self.record).await
    }

    /// Taking, listing, rewinding to and forking from snapshots.
    pub fn snapshots(&self) -> Snapshots {
        Snapshots::new(self.silo.clone(), self.record.id.clone())
    }

    /// Pushes `files` to `mount`, swapped in whole or not at all.
    pub async fn push(
        &self,
        mount: &str,
        files: FileSet,
        options: &PushOptions,
    ) -> Result<PushReport, PushError> {
        self.silo
            .push_to_sandboxes(mount, vec![(self.record.clone(), files)], options)
            .await
    }

    /// Where its agent listens and the key it accepts, for a client of
    /// its own (docs/protocol.md, "Connecting to a sandbox").
    pub fn agent_address(&self) -> Result<AgentAddress, SiloError> {
        let client = self.silo.client(&self.record)?;
        let key = self.silo.sandbox_key(&self.record).to_hex();
        Ok(AgentAddress::new(&self.record.id, client.endpoint(), key))
    }

    /// Where `port` inside it is reached from the host (a URL, its host,
    /// and any header a client must send), as its backend routes it: the
    /// host's own port on the local backend, the provider's proxy on E2B
    /// and Daytona; a Docker sandbox publishes none, and the error says so.
    pub async fn port_url(&self, port: u16) -> Result<PortUrl, SiloError> {
        self.silo.port_url(&self.record, port).await
    }

    /// Stops it `after` from now, whatever runs (a lifetime beside the idle
    /// timeout; its files stay, as with [`Sandbox::stop`]), or clears that
    /// deadline (`None`). Its agent keeps the deadline, so it holds with
    /// no client connected, and ends with the agent. Answers the time left.
    pub async fn set_timeout(
        &self,
        after: Option<Duration>,
    ) -> Result<Option<Duration>, SiloError> {
        let client = self.silo.client(&self.record)?;
        match client.set_deadline(after).await {
            Ok(left) => Ok(left),
            Err(source) => Err(self.silo.unreachable(&self.record, source).await),
        }
    }

    /// The time left before it stops by [`Sandbox::set_timeout`]; `None`
    /// when no deadline is set.
    pub async fn timeout(&self) -> Result<Option<Duration>, SiloError> {
        let client = self.silo.client(&self.record)?;
        match client.deadline().await {
            Ok(left) => Ok(left),
            Err(source) => Err(self.silo.unreachable(&self.record, source).await),
        }
    }

    /// Stops it; its files stay. Answers whether it was running.
    pub async fn stop(&self) -> Result<bool, SiloError> {
        self.silo.stop(&self.record.id).await
    }

    /// Removes it and its machine (its events stay in the log).
    pub async fn remove(self) -> Result<SandboxRecord, SiloError> {
        self.silo.remove(&self.record.id).await
    }
}

impl Silo {
    /// Opens the sandbox `request.name` or creates it (see [`Silo::up`]),
    /// and answers a handle on it with what was done.
    pub async fn up_sandbox(&self, request: UpRequest) -> Result<(Sandbox, UpOutcome), SiloError> {
        let outcome = self.up(request).await?;
        let sandbox = Sandbox::new(self.clone(), outcome.sandbox.clone())?;
        Ok((sandbox, outcome))
    }

    /// A handle on an existing sandbox as it is: one that is stopped is not
    /// started (it was stopped on purpose, or by its idle timeout), and the
    /// error says so, as [`Silo::connect`]'s does.
    pub async fn running_sandbox(&self, name_or_id: &str) -> Result<Sandbox, SiloError> {
        let record = self.get(name_or_id)?;
        if let Err(source) = self.client(&record)?.healthz().await {
            return Err(self.unreachable(&record, source).await);
        }
        Sandbox::new(self.clone(), record)
    }

    /// A handle on an existing sandbox, started first if it was stopped.
    pub async fn sandbox(&self, name_or_id: &str) -> Result<Sandbox, SiloError> {
        let record = self.get(name_or_id)?;
        let record = self.ensure_running(&record).await?;
        Sandbox::new(self.clone(), record)
    }
}
