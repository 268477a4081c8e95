//! `GET /v2/sandboxes` (and the deprecated `GET /sandboxes`): the query
//! as e2b-dev/infra's API reads it, and its keyset pagination.
//!
//! `metadata` is decoded as the API does: the query value (already
//! decoded once) is unescaped again as a whole, split on `&` and `=`, and
//! each key and value unescaped once more. Pages are ordered by start time
//! (newest first unless `order=asc`), then by id; `X-Next-Token` is the
//! base64 (URL alphabet, padded) of `<RFC 3339 time>__<id>` (with `__asc`
//! for ascending pages), the last item of the page.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use http::StatusCode;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::model::ListedSandbox;
use super::store::{Record, Refusal, State};
use super::{CLIENT_ID, ENVD_VERSION};
use crate::http::query_value;

/// Default and largest page size.
pub const MAX_LIMIT: i64 = 100;
/// vCPUs every mock template declares (not enforced).
pub const TEMPLATE_CPU_COUNT: u32 = 2;
/// Memory every mock template declares (not enforced).
pub const TEMPLATE_MEMORY_MB: u32 = 512;
/// Disk every mock template declares (not enforced).
pub const TEMPLATE_DISK_MB: u32 = 512;
/// The cursor's id on a first descending page: after every real id.
const MAX_SANDBOX_ID: &str = "zzzzzzzzzzzzzzzzzzzz";

/// One page of a listing and its headers.
pub struct Page {
    /// The sandboxes.
    pub items: Vec<ListedSandbox>,
    /// `X-Next-Token`, when there is more.
    pub next_token: Option<String>,
    /// `X-Total-Running`, when running sandboxes were asked for.
    pub total_running: Option<usize>,
}

/// `GET /v2/sandboxes` over `records`; `templates` are the known ids.
pub fn list_v2(
    records: Vec<Record>,
    query: &[(String, String)],
    known_template: impl Fn(&str) -> bool,
) -> Result<Page, Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    let (want_running, want_paused) = states(query).map_err(bad)?;
    let ascending = match query_value(query, "order") {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(bad(format!(
                "Invalid order parameter: unknown order {other:?}"
            )));
        }
    };
    let limit = parse_limit(query)?;
    let cursor = match query_value(query, "nextToken").filter(|t| !t.is_empty()) {
        Some(token) => {
            parse_cursor(token, ascending).ok_or_else(|| bad("Invalid next token".into()))?
        }
        None if ascending => (i128::MIN, String::new()),
        None => (micros(SystemTime::now()), MAX_SANDBOX_ID.to_owned()),
    };
    let metadata = match query_value(query, "metadata") {
        Some(text) => {
            Some(parse_metadata(text).ok_or_else(|| bad("Error parsing metadata".into()))?)
        }
        None => None,
    };
    let started_after = match query_value(query, "startedAfter") {
        Some(text) => Some(
            OffsetDateTime::parse(text, &Rfc3339)
                .map(|t| t.unix_timestamp_nanos() / 1000)
                .map_err(|_| {
                    bad(format!(
                        "validation error: startedAfter {text:?} is no date-time"
                    ))
                })?,
        ),
        None => None,
    };
    let template = match query_value(query, "template") {
        Some(t) if t.contains(':') => {
            return Err(bad(
                "Invalid template: tags are not supported here because sandboxes are not tag-scoped"
                    .into(),
            ));
        }
        Some(t) if !known_template(t) => {
            return Ok(Page {
                items: Vec::new(),
                next_token: None,
                total_running: want_running.then_some(0),
            });
        }
        other => other,
    };

    let mut matching: Vec<Record> = records
        .into_iter()
        .filter(|r| match r.state {
            State::Running | State::Snapshotting => want_running,
            State::Paused | State::Pausing => want_paused,
            State::Resuming | State::Killing => false,
        })
        .filter(|r| metadata.as_ref().is_none_or(|m| matches(&r.metadata, m)))
        .filter(|r| started_after.is_none_or(|t| micros(r.started_at) >= t))
        .filter(|r| template.is_none_or(|t| r.template_id == t))
        .collect();
    let total_running = want_running.then(|| matching.iter().filter(|r| r.state.runs()).count());
    matching.retain(|r| after_cursor(r, &cursor, ascending));
    matching.sort_by(|a, b| {
        let by_time = micros(a.started_at).cmp(&micros(b.started_at));
        if ascending {
            by_time.then_with(|| b.id.cmp(&a.id))
        } else {
            by_time.reverse().then_with(|| a.id.cmp(&b.id))
        }
    });
    let next_token = (matching.len() > limit).then(|| {
        let last = &matching[limit - 1];
        cursor_token(last.started_at, &last.id, ascending)
    });
    matching.truncate(limit);
    Ok(Page {
        items: matching.iter().map(listed).collect(),
        next_token,
        total_running,
    })
}

/// The deprecated `GET /sandboxes`: running sandboxes, newest first.
pub fn list_v1(
    records: Vec<Record>,
    query: &[(String, String)],
) -> Result<Vec<ListedSandbox>, Refusal> {
    let metadata = match query_value(query, "metadata") {
        Some(text) => Some(parse_metadata(text).ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "Error parsing metadata: error parsing metadata: invalid key value pair in query",
            )
        })?),
        None => None,
    };
    let mut running: Vec<Record> = records
        .into_iter()
        .filter(|r| r.state.runs())
        .filter(|r| metadata.as_ref().is_none_or(|m| matches(&r.metadata, m)))
        .collect();
    running.sort_by(|a, b| {
        b.started_at
            .cmp(&a.started_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok(running.iter().map(listed).collect())
}

/// A record as a `ListedSandbox`.
pub fn listed(record: &Record) -> ListedSandbox {
    let state = match record.state {
        State::Paused | State::Pausing => "paused",
        _ => "running",
    };
    ListedSandbox {
        template_id: record.template_id.clone(),
        sandbox_id: record.id.clone(),
        client_id: CLIENT_ID.to_owned(),
        alias: record.alias.clone(),
        started_at: rfc3339(record.started_at),
        end_at: rfc3339(record.end_at),
        cpu_count: TEMPLATE_CPU_COUNT,
        memory_mb: TEMPLATE_MEMORY_MB,
        disk_size_mb: TEMPLATE_DISK_MB,
        state: state.to_owned(),
        envd_version: ENVD_VERSION.to_owned(),
        metadata: (!record.metadata.is_empty()).then(|| record.metadata.clone()),
    }
}

/// RFC 3339 text of a time, with as many fraction digits as it needs.
pub fn rfc3339(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// The page size a query asks for: 1 to [`MAX_LIMIT`], that by default.
pub fn parse_limit(query: &[(String, String)]) -> Result<usize, Refusal> {
    let limit = match query_value(query, "limit") {
        None => MAX_LIMIT,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("validation error: limit {text:?} must be 1..=100"),
                ));
            }
        },
    };
    Ok(usize::try_from(limit).unwrap_or(usize::MAX))
}

/// Which states `state=running,paused` asks for (both when absent).
fn states(query: &[(String, String)]) -> Result<(bool, bool), String> {
    let mut asked = query
        .iter()
        .filter(|(k, _)| k == "state")
        .flat_map(|(_, v)| v.split(','))
        .peekable();
    if asked.peek().is_none() {
        return Ok((true, true));
    }
    let (mut running, mut paused) = (false, false);
    for state in asked {
        match state {
            "running" => running = true,
            "paused" => paused = true,
            other => return Err(format!("validation error: unknown state {other:?}")),
        }
    }
    Ok((running, paused))
}

/// The metadata filter, as the API parses it; `None` if malformed.
fn parse_metadata(text: &str) -> Option<BTreeMap<String, String>> {
    let whole = query_unescape(text)?;
    let mut filter = BTreeMap::new();
    for pair in whole.split('&') {
        let mut parts = pair.split('=');
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        filter.insert(query_unescape(key)?, query_unescape(value)?);
    }
    Some(filter)
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte, and a broken
/// escape or invalid UTF-8 is an error.
fn query_unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn matches(metadata: &BTreeMap<String, String>, filter: &BTreeMap<String, String>) -> bool {
    filter.iter().all(|(k, v)| metadata.get(k) == Some(v))
}

/// Microseconds since the epoch (the cursor's resolution).
pub fn micros(at: SystemTime) -> i128 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i128,
        Err(e) => -(e.duration().as_micros() as i128),
    }
}

fn after_cursor(record: &Record, (time, id): &(i128, String), ascending: bool) -> bool {
    let at = micros(record.started_at);
    if ascending {
        at > *time || (at == *time && record.id < *id)
    } else {
        at < *time || (at == *time && record.id > *id)
    }
}

/// The `X-Next-Token` after an item at `at` with `id`.
pub fn cursor_token(at: SystemTime, id: &str, ascending: bool) -> String {
    let mut text = format!("{}__{id}", rfc3339(at));
    if ascending {
        text.push_str("__asc");
    }
    URL_SAFE.encode(text)
}

/// A `nextToken` as its time (microseconds) and id, if it is one for this order.
pub fn parse_cursor(token: &str, ascending: bool) -> Option<(i128, String)> {
    let text = String::from_utf8(URL_SAFE.decode(token).ok()?).ok()?;
    let parts: Vec<&str> = text.split("__").collect();
    let token_ascending = match parts.as_slice() {
        [_, _] => false,
        [_, _, "asc"] => true,
        _ => return None,
    };
    if token_ascending != ascending {
        return None;
    }
    let at = OffsetDateTime::parse(parts[0], &Rfc3339).ok()?;
    Some((at.unix_timestamp_nanos() / 1000, parts[1].to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_unescaped_like_the_api() {
        let parsed = parse_metadata("user%3Dalice%26app%3Dmy%2520app").unwrap();
        assert_eq!(parsed.get("user").map(String::as_str), Some("alice"));
        assert_eq!(parsed.get("app").map(String::as_str), Some("my app"));
        assert!(parse_metadata("a=b=c").is_none());
        assert!(parse_metadata("novalue").is_none());
        assert!(parse_metadata("a=%zz").is_none());
    }

    #[test]
    fn states_default_to_both() {
        assert_eq!(states(&[]), Ok((true, true)));
        let q = vec![("state".to_owned(), "paused".to_owned())];
        assert_eq!(states(&q), Ok((false, true)));
        let q = vec![("state".to_owned(), "running,sleeping".to_owned())];
        assert!(states(&q).is_err());
    }

    #[test]
    fn cursor_round_trips_in_its_direction() {
        let token = URL_SAFE.encode("2026-01-02T03:04:05.123456Z__iabc");
        let (at, id) = parse_cursor(&token, false).unwrap();
        assert_eq!(id, "iabc");
        assert_eq!(at % 1_000_000, 123_456);
        assert!(parse_cursor(&token, true).is_none());
        assert!(parse_cursor("not base64!", false).is_none());
    }
}
