//! Creating a sandbox: `POST /v2/sandboxes` (`NewSandboxV2`, what the
//! current SDKs send: envd access is always secured, so every sandbox gets
//! an `envdAccessToken`; `timeout` defaults to 300 s; an `Idempotency-Key`
//! header answers a repeated create with the sandbox the first one made)
//! and the older `POST /sandboxes` (`NewSandbox`: `secure` opts in, the
//! timeout defaults to 15 s). Both check the body as the API does (the
//! template through [`Templates`], so a snapshot is a template too; the
//! network rules through [`network`]) and answer `201` with `Sandbox`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;

use super::model::NewSandbox;
use super::network;
use super::store::{NewRecord, Refusal};
use super::templates::Templates;

/// A v1 sandbox's lifetime when `timeout` is not given.
pub const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// A v2 sandbox's lifetime when `timeout` is not given (`NewSandboxV2`'s default).
pub const DEFAULT_V2_TIMEOUT_SECS: i64 = 300;
/// The longest lifetime a team may ask for (E2B's Pro tier).
pub const MAX_TIMEOUT_HOURS: i64 = 24;
/// Most idempotency keys remembered; the oldest is forgotten past it.
pub const MAX_IDEMPOTENCY_KEYS: usize = 4096;
/// The header a v2 create may carry.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Which create route a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `POST /sandboxes`.
    V1,
    /// `POST /v2/sandboxes`.
    V2,
}

/// The record a valid `NewSandbox`/`NewSandboxV2` asks for.
pub fn parse(
    new: NewSandbox,
    version: Version,
    templates: &Templates,
) -> Result<NewRecord, Refusal> {
    let bad = |message: &str| Refusal::new(StatusCode::BAD_REQUEST, message);
    let template = templates.resolve(&new.template_id)?;
    let default_timeout = match version {
        Version::V1 => DEFAULT_TIMEOUT_SECS,
        Version::V2 => DEFAULT_V2_TIMEOUT_SECS,
    };
    let timeout = match new.timeout {
        None => default_timeout,
        Some(t) if t <= 0 => return Err(bad("Timeout must be greater than 0")),
        Some(t) if t > MAX_TIMEOUT_HOURS * 3600 => {
            return Err(bad(&format!(
                "Timeout cannot be greater than {MAX_TIMEOUT_HOURS} hours"
            )));
        }
        Some(t) => t,
    };
    let auto_pause = new.auto_pause.unwrap_or(false);
    let auto_resume = new.auto_resume.is_some_and(|r| r.enabled);
    let memory_pause = new.auto_pause_memory.unwrap_or(true);
    if !memory_pause && !auto_pause {
        return Err(bad(
            "autoPauseMemory=false only applies when autoPause is true.",
        ));
    }
    if !memory_pause && auto_resume {
        return Err(bad(
            "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume: a filesystem-only snapshot cannot be auto-resumed by traffic and must be resumed explicitly.",
        ));
    }
    let secure = match version {
        Version::V1 => new.secure.unwrap_or(false),
        Version::V2 => true,
    };
    let mut private = false;
    if let Some(network) = new.network.as_ref().filter(|n| !n.is_null()) {
        private = network::check_create(network)?;
        if private && !secure {
            return Err(bad(
                "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag.",
            ));
        }
    }
    if new.volume_mounts.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(bad("Volume mounts are not enabled."));
    }
    Ok(NewRecord {
        template_id: template.template_id,
        alias: template.alias,
        image: template.image,
        timeout: Duration::from_secs(timeout.unsigned_abs()),
        metadata: new.metadata.unwrap_or_default(),
        env_vars: new.env_vars.unwrap_or_default(),
        secure,
        private,
        auto_pause,
        auto_resume,
        allow_internet_access: new.allow_internet_access,
        network: new.network,
    })
}

/// Idempotency keys of v2 creates and the sandbox each made.
#[derive(Default)]
pub struct IdempotencyKeys {
    made: Mutex<(HashMap<String, String>, std::collections::VecDeque<String>)>,
}

impl IdempotencyKeys {
    /// The sandbox an earlier create with `key` made.
    pub fn get(&self, key: &str) -> Option<String> {
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        made.0.get(key).cloned()
    }

    /// Remembers that `key` made `sandbox_id`.
    pub fn remember(&self, key: &str, sandbox_id: &str) {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if made
            .0
            .insert(key.to_owned(), sandbox_id.to_owned())
            .is_none()
        {
            made.1.push_back(key.to_owned());
        }
        while made.1.len() > MAX_IDEMPOTENCY_KEYS {
            if let Some(oldest) = made.1.pop_front() {
                made.0.remove(&oldest);
            }
        }
    }
}
