//! The team's snapshot templates after they are made ([`super::fork`]
//! makes them): `GET /snapshots` (`sandboxID`, `name`, `limit`,
//! `nextToken`; newest first, `X-Next-Token` as the sandbox listing writes
//! it) and `DELETE /templates/{templateID}` for a snapshot template (the
//! SDK's `delete_snapshot`), refused while a sandbox made from it lives.
//! Deleting one of the configured templates is not modelled.

use std::time::SystemTime;

use http::StatusCode;

use super::list::{cursor_token, micros, parse_cursor, parse_limit};
use super::model::SnapshotInfo;
use super::store::{Refusal, Store, short_id};
use super::templates::{self, Templates};
use crate::http::query_value;

/// The cursor's id on a first page: after every template id.
const MAX_SNAPSHOT_ID: &str = "zzzzzzzzzzzzzzzzzzzzzzzz";

/// One page of snapshots and its `X-Next-Token`.
pub struct Page {
    /// The snapshots.
    pub items: Vec<SnapshotInfo>,
    /// The token of the next page, when there is one.
    pub next_token: Option<String>,
}

/// `GET /snapshots`.
pub fn list(templates: &Templates, query: &[(String, String)]) -> Result<Page, Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    let limit = parse_limit(query)?;
    let cursor = match query_value(query, "nextToken").filter(|t| !t.is_empty()) {
        Some(token) => {
            parse_cursor(token, false).ok_or_else(|| bad("Invalid next token".into()))?
        }
        None => (micros(SystemTime::now()), MAX_SNAPSHOT_ID.to_owned()),
    };
    let sandbox = match query_value(query, "sandboxID") {
        Some(id) => Some(short_id(id)?),
        None => None,
    };
    let mut template = None;
    let mut tag = None;
    if let Some(raw) = query_value(query, "name") {
        let name = templates::parse_name(raw).map_err(|e| bad(format!("Invalid name: {e}")))?;
        templates::check_namespace(&name.identifier).map_err(bad)?;
        let Some((template_id, _)) = templates.find_snapshot(&name.identifier) else {
            return Ok(Page {
                items: Vec::new(),
                next_token: None,
            });
        };
        template = Some(template_id);
        // A bare name matches every tag; `name:default` only the default one.
        tag = raw.contains(':').then(|| name.tag_or_default().to_owned());
    }
    let mut matching: Vec<_> = templates
        .list()
        .into_iter()
        .filter(|s| sandbox.as_ref().is_none_or(|id| &s.sandbox_id == id))
        .filter(|s| template.as_ref().is_none_or(|t| &s.template_id == t))
        .filter(|s| {
            tag.as_ref()
                .is_none_or(|t| s.snapshot_id.ends_with(&format!(":{t}")))
        })
        .filter(|s| {
            let at = micros(s.created_at);
            at < cursor.0 || (at == cursor.0 && s.template_id < cursor.1)
        })
        .collect();
    let next_token = (matching.len() > limit).then(|| {
        let last = &matching[limit - 1];
        cursor_token(last.created_at, &last.template_id, false)
    });
    matching.truncate(limit);
    Ok(Page {
        items: matching
            .into_iter()
            .map(|s| SnapshotInfo {
                snapshot_id: s.snapshot_id,
                names: s.names,
            })
            .collect(),
        next_token,
    })
}

/// `DELETE /templates/{templateID}` of a snapshot template: its images
/// go (those a later commit builds on stay until the mock stops).
pub async fn delete(store: &Store, templates: &Templates, reference: &str) -> Result<(), Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    let name =
        templates::parse_name(reference).map_err(|e| bad(format!("Invalid template ID: {e}")))?;
    let Some((template_id, images)) = templates.find_snapshot(&name.identifier) else {
        if templates.is_configured(&name.identifier) {
            return Err(bad(format!(
                "the mock does not model deleting template '{}' (only snapshot templates)",
                name.identifier
            )));
        }
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("template '{}' not found", name.identifier),
        ));
    };
    let users: Vec<_> = store
        .all()
        .into_iter()
        .filter(|r| r.template_id == template_id)
        .collect();
    if let Some(user) = users.first() {
        let how = if user.state.runs() {
            "running"
        } else {
            "paused"
        };
        return Err(bad(format!(
            "cannot delete template '{template_id}' because there are {how} sandboxes using it"
        )));
    }
    templates.remove_snapshot(&template_id);
    for image in images {
        store.remove_image(&image).await;
    }
    Ok(())
}
