//! Copies of a running sandbox: `POST /sandboxes/{id}/fork` (new
//! sandboxes from a checkpoint of it) and `POST /sandboxes/{id}/snapshots`
//! (a snapshot template to create sandboxes from later), with the API's
//! checks, statuses and messages.
//!
//! E2B checkpoints the VM, memory included; the mock cannot carry memory
//! or processes across containers (no CRIU on this engine), so a
//! checkpoint here is the sandbox's file system committed to an image
//! (`docker commit`, which freezes the container while it copies, as the
//! checkpoint briefly pauses the VM). A fork or a sandbox made from a
//! snapshot starts from that image with the original's files and no
//! process but PID 1. The original keeps running, its id, timeout and
//! processes untouched.

use std::time::Duration;

use http::StatusCode;

use super::model::{ApiError, ForkRequest, ForkResult, SnapshotInfo, SnapshotRequest};
use super::store::{NewRecord, Record, Refusal, State, Store};
use super::templates::{self, TEAM_SLUG, TEMPLATE_ID_LEN, Templates};
use crate::secret::{ALPHABET, random_text};

/// A fork's lifetime when the request gives none (the API's sandbox default).
pub const DEFAULT_FORK_TIMEOUT_SECS: i64 = 15;
/// Most forks one request may ask for (the API's `maxForkCount`).
pub const MAX_FORK_COUNT: i64 = 100;

/// Forks a running sandbox `count` times; one result per fork.
pub async fn fork(
    store: &Store,
    id: &str,
    body: ForkRequest,
    max_timeout_hours: i64,
) -> Result<Vec<ForkResult>, Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    let timeout = match body.timeout {
        None => DEFAULT_FORK_TIMEOUT_SECS,
        Some(t) if t <= 0 => return Err(bad("Timeout must be greater than 0".into())),
        Some(t) if t > max_timeout_hours * 3600 => {
            return Err(bad(format!(
                "Timeout cannot be greater than {max_timeout_hours} hours"
            )));
        }
        Some(t) => t,
    };
    let count = body.count.unwrap_or(1);
    if count < 1 {
        return Err(bad("Count must be at least 1".into()));
    }
    if count > MAX_FORK_COUNT {
        return Err(bad(format!(
            "Count cannot be greater than {MAX_FORK_COUNT}"
        )));
    }
    let original = store.get(id).ok_or_else(|| Refusal::not_found(id))?;
    let image = store
        .checkpoint(id, |state| match state {
            State::Running => Ok(()),
            State::Paused => Err(Refusal::new(
                StatusCode::CONFLICT,
                format!("Sandbox '{id}' is paused and cannot be forked; resume it first"),
            )),
            State::Killing => Err(Refusal::not_found(id)),
            other => Err(Refusal::new(
                StatusCode::CONFLICT,
                format!(
                    "Sandbox '{id}' cannot be forked while in '{}' state",
                    state_name(other)
                ),
            )),
        })
        .await?;
    let mut results = Vec::new();
    for _ in 0..count {
        let new = copy_of(
            &original,
            &image,
            Duration::from_secs(timeout.unsigned_abs()),
        );
        results.push(match store.create(new).await {
            Ok(record) => ForkResult {
                sandbox: Some(store.sandbox_json(&record)),
                error: None,
            },
            Err(refusal) => ForkResult {
                sandbox: None,
                error: Some(ApiError {
                    code: refusal.status.as_u16(),
                    message: refusal.message,
                }),
            },
        });
    }
    Ok(results)
}

/// Snapshots a running sandbox into a template of the team.
pub async fn snapshot(
    store: &Store,
    templates: &Templates,
    id: &str,
    body: SnapshotRequest,
) -> Result<SnapshotInfo, Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    let name = match &body.name {
        Some(name) => {
            let name =
                templates::parse_name(name).map_err(|e| bad(format!("Invalid name: {e}")))?;
            templates::check_namespace(&name.identifier).map_err(bad)?;
            Some(name)
        }
        None => None,
    };
    let image = store
        .checkpoint(id, |state| match state {
            State::Running => Ok(()),
            State::Paused | State::Killing => Err(Refusal::not_found(id)),
            other => Err(Refusal::new(
                StatusCode::CONFLICT,
                format!(
                    "Sandbox '{id}' cannot be snapshotted while in '{}' state",
                    state_name(other)
                ),
            )),
        })
        .await?;
    let alias = name.as_ref().map(|n| {
        n.identifier
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    });
    let template_id = match name.as_ref().and_then(|n| templates.snapshot_template(n)) {
        Some(existing) => existing,
        None => random_text(TEMPLATE_ID_LEN, ALPHABET).map_err(|e| {
            tracing::warn!(error = %e, "the system's random generator failed");
            Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Error creating snapshot template",
            )
        })?,
    };
    let tag = name
        .as_ref()
        .map_or(templates::DEFAULT_TAG, |n| n.tag_or_default())
        .to_owned();
    if let Some(replaced) = templates.add_snapshot(&template_id, alias.as_deref(), &tag, &image, id)
    {
        store.remove_image(&replaced).await;
    }
    let names: Vec<String> = alias.iter().map(|a| format!("{TEAM_SLUG}/{a}")).collect();
    Ok(SnapshotInfo {
        snapshot_id: format!("{}:{tag}", names.first().unwrap_or(&template_id)),
        names,
    })
}

/// What a fork of `original` from `image` is made with: its template,
/// metadata, environment and network rules, new tokens.
fn copy_of(original: &Record, image: &str, timeout: Duration) -> NewRecord {
    NewRecord {
        template_id: original.template_id.clone(),
        alias: original.alias.clone(),
        image: image.to_owned(),
        timeout,
        metadata: original.metadata.clone(),
        env_vars: original.env_vars.clone(),
        secure: original.envd_token.is_some(),
        private: original.traffic_token.is_some(),
        auto_pause: original.auto_pause,
        auto_resume: original.auto_resume,
        allow_internet_access: original.allow_internet_access,
        network: original.network.clone(),
    }
}

/// The state's name in the API's messages.
fn state_name(state: State) -> &'static str {
    match state {
        State::Running => "running",
        State::Pausing => "pausing",
        State::Paused => "paused",
        State::Resuming => "resuming",
        State::Snapshotting => "snapshotting",
        State::Killing => "killing",
    }
}
