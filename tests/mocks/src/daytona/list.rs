//! `GET /sandbox`, the listing: the query read as the API reads it (the
//! `extended` query parser, so a repeated parameter is an array, then the
//! validation pipe), the filters, the order and the cursor pages.
//!
//! `labels` is ONE JSON-encoded object (`labels={"a":"b"}`) and matches
//! sandboxes whose labels contain every pair; repeated `labels=k=v`
//! parameters arrive as an array and fail the pipe (`labels must be a
//! string`), one that is not JSON fails the service (`Invalid labels JSON
//! format`). Pages hold `limit` items (1..=200, default 100) sorted by
//! `sort`/`order` (default `lastActivityAt` descending) with the id as the
//! tie-breaker; `nextCursor` is base64 JSON `{sortValue, id}` of the last
//! item, null on the last page. Not modelled (accepted, ignored):
//! `lastEventAfter`, `lastEventBefore`, `isRecoverable`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::model::iso_millis;
use super::store::{Record, Refusal};

/// Items per page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest `limit`.
pub const MAX_LIMIT: usize = 200;
/// `SandboxState` without `destroyed`: what `states` may name.
const LISTABLE_STATES: [&str; 21] = [
    "creating",
    "restoring",
    "destroying",
    "started",
    "stopped",
    "starting",
    "stopping",
    "error",
    "build_failed",
    "pending_build",
    "building_snapshot",
    "unknown",
    "pulling_snapshot",
    "archived",
    "archiving",
    "resizing",
    "snapshotting",
    "forking",
    "pausing",
    "paused",
    "resuming",
];
/// `SandboxListSortField`.
const SORT_FIELDS: [&str; 6] = [
    "name",
    "cpu",
    "memoryGib",
    "diskGib",
    "lastActivityAt",
    "createdAt",
];

/// One query parameter as the extended parser hands it over.
#[derive(Debug, Clone, PartialEq)]
enum Param {
    One(String),
    Many(Vec<String>),
    /// `key[sub]=…`: an object.
    Nested,
}

/// A checked listing query.
#[derive(Debug)]
pub struct ListQuery {
    cursor: Option<(Value, String)>,
    limit: usize,
    id: Option<String>,
    name: Option<String>,
    labels: Option<Value>,
    states: Option<Vec<String>>,
    snapshots: Option<Vec<String>>,
    regions: Option<Vec<String>>,
    is_public: Option<bool>,
    created_after: Option<SystemTime>,
    created_before: Option<SystemTime>,
    bounds: BTreeMap<&'static str, (Option<u32>, Option<u32>)>,
    sort: String,
    descending: bool,
}

/// Reads the query pairs of `GET /sandbox`.
pub fn parse(pairs: &[(String, String)]) -> Result<ListQuery, Refusal> {
    let params = group(pairs);
    let mut messages = Vec::new();
    let text = |key: &str, messages: &mut Vec<String>| match params.get(key) {
        None => None,
        Some(Param::One(v)) => Some(v.clone()),
        Some(_) => {
            messages.push(format!("{key} must be a string"));
            None
        }
    };
    let list = |key: &str| match params.get(key) {
        None => None,
        Some(Param::One(v)) => Some(vec![v.clone()]),
        Some(Param::Many(vs)) => Some(vs.clone()),
        Some(Param::Nested) => Some(Vec::new()),
    };
    let flag = |key: &str| match params.get(key) {
        Some(Param::One(v)) => Some(v == "true"),
        Some(_) => Some(false),
        None => None,
    };

    let cursor_text = text("cursor", &mut messages);
    let limit = match params.get("limit") {
        None => DEFAULT_LIMIT,
        Some(Param::One(v)) => match v.trim().parse::<f64>() {
            Ok(n) if n.fract() == 0.0 && (1.0..=MAX_LIMIT as f64).contains(&n) => n as usize,
            Ok(n) if n.fract() == 0.0 && n < 1.0 => {
                messages.push("limit must not be less than 1".into());
                0
            }
            Ok(n) if n.fract() == 0.0 => {
                messages.push(format!("limit must not be greater than {MAX_LIMIT}"));
                0
            }
            _ => {
                messages.push("limit must be an integer number".into());
                0
            }
        },
        Some(_) => {
            messages.push("limit must be an integer number".into());
            0
        }
    };
    let id = text("id", &mut messages);
    let name = text("name", &mut messages);
    let labels_text = text("labels", &mut messages);
    let states = list("states");
    if states
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.iter().any(|s| !LISTABLE_STATES.contains(&s.as_str())))
    {
        messages.push(format!(
            "each value must be one of the following values: {}",
            LISTABLE_STATES.join(", ")
        ));
    }
    let mut bounds = BTreeMap::new();
    for (field, low, high) in [
        ("cpu", "minCpu", "maxCpu"),
        ("memory", "minMemoryGiB", "maxMemoryGiB"),
        ("disk", "minDiskGiB", "maxDiskGiB"),
    ] {
        let mut bound = |key: &str| match params.get(key) {
            None => None,
            Some(Param::One(v)) => match v.trim().parse::<f64>() {
                Ok(n) if n.fract() == 0.0 && n >= 1.0 => Some(n as u32),
                Ok(n) if n.fract() == 0.0 => {
                    messages.push(format!("{key} must not be less than 1"));
                    None
                }
                _ => {
                    messages.push(format!("{key} must be an integer number"));
                    None
                }
            },
            Some(_) => {
                messages.push(format!("{key} must be an integer number"));
                None
            }
        };
        let range = (bound(low), bound(high));
        bounds.insert(field, range);
    }
    let mut date = |key: &str| match params.get(key) {
        None => None,
        Some(Param::One(v)) => match OffsetDateTime::parse(v, &Rfc3339) {
            Ok(at) => Some(SystemTime::from(at)),
            Err(_) => {
                messages.push(format!("{key} must be a Date instance"));
                None
            }
        },
        Some(_) => {
            messages.push(format!("{key} must be a Date instance"));
            None
        }
    };
    let created_after = date("createdAtAfter");
    let created_before = date("createdAtBefore");
    let sort = match params.get("sort") {
        None => "lastActivityAt".to_owned(),
        Some(Param::One(v)) if SORT_FIELDS.contains(&v.as_str()) => v.clone(),
        Some(_) => {
            messages.push(format!(
                "sort must be one of the following values: {}",
                SORT_FIELDS.join(", ")
            ));
            String::new()
        }
    };
    let descending = match params.get("order") {
        None => true,
        Some(Param::One(v)) if v == "asc" || v == "desc" => v == "desc",
        Some(_) => {
            messages.push("order must be one of the following values: asc, desc".into());
            true
        }
    };
    if !messages.is_empty() {
        return Err(Refusal::bad(messages.join(", ")));
    }
    let labels = match labels_text {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<Value>(&text)
                .map_err(|_| Refusal::bad("Invalid labels JSON format"))?,
        ),
    };
    let cursor = match cursor_text {
        None => None,
        Some(text) => Some(
            decode_cursor(&text)
                .ok_or_else(|| Refusal::bad(format!("Invalid cursor provided: {text}")))?,
        ),
    };
    Ok(ListQuery {
        cursor,
        limit,
        id: id.map(|p| p.to_lowercase()),
        name: name.map(|p| p.to_lowercase()),
        labels,
        states,
        snapshots: list("snapshots"),
        regions: list("regionIds"),
        is_public: flag("isPublic"),
        created_after,
        created_before,
        bounds,
        sort,
        descending,
    })
}

/// The page of `records` the query asks for, and the next page's cursor.
/// `resources` are the (cpu, memory, disk) every sandbox has.
pub fn page(
    mut records: Vec<Record>,
    query: &ListQuery,
    resources: (u32, u32, u32),
) -> (Vec<Record>, Option<String>) {
    records.retain(|r| matches(r, query, resources));
    let key = |r: &Record| sort_value(r, &query.sort, resources);
    let order = |a: &(Value, String), b: &(Value, String)| {
        let ordering = compare(&a.0, &b.0).then_with(|| a.1.cmp(&b.1));
        if query.descending {
            ordering.reverse()
        } else {
            ordering
        }
    };
    let mut keyed: Vec<((Value, String), Record)> = records
        .into_iter()
        .map(|r| ((key(&r), r.id.clone()), r))
        .collect();
    keyed.sort_by(|a, b| order(&a.0, &b.0));
    if let Some(cursor) = &query.cursor {
        keyed.retain(|(k, _)| order(k, cursor) == Ordering::Greater);
    }
    let more = keyed.len() > query.limit;
    keyed.truncate(query.limit);
    let next = more
        .then(|| keyed.last())
        .flatten()
        .map(|((value, id), _)| STANDARD.encode(json!({"sortValue": value, "id": id}).to_string()));
    (keyed.into_iter().map(|(_, r)| r).collect(), next)
}

fn matches(record: &Record, query: &ListQuery, (cpu, memory, disk): (u32, u32, u32)) -> bool {
    let prefix = |value: &str, wanted: &Option<String>| {
        wanted
            .as_ref()
            .is_none_or(|p| value.to_lowercase().starts_with(p.as_str()))
    };
    let within = |field: &str, value: u32| {
        query.bounds.get(field).is_none_or(|(low, high)| {
            low.is_none_or(|l| value >= l) && high.is_none_or(|h| value <= h)
        })
    };
    let labels_match = match &query.labels {
        None => true,
        Some(Value::Object(wanted)) => wanted.iter().all(|(k, v)| {
            v.as_str()
                .is_some_and(|v| record.labels.get(k).is_some_and(|l| l == v))
        }),
        // Containment of a non-object in an object never holds.
        Some(_) => false,
    };
    let state = record.state.as_str();
    prefix(&record.id, &query.id)
        && prefix(&record.name, &query.name)
        && labels_match
        && query
            .states
            .as_ref()
            .is_none_or(|s| s.iter().any(|s| s == state))
        && query
            .snapshots
            .as_ref()
            .is_none_or(|s| s.contains(&record.snapshot))
        && query
            .regions
            .as_ref()
            .is_none_or(|r| r.contains(&record.target))
        && query.is_public.is_none_or(|p| record.public == p)
        && query.created_after.is_none_or(|at| record.created_at > at)
        && query.created_before.is_none_or(|at| record.created_at < at)
        && within("cpu", cpu)
        && within("memory", memory)
        && within("disk", disk)
}

fn sort_value(record: &Record, sort: &str, (cpu, memory, disk): (u32, u32, u32)) -> Value {
    match sort {
        "name" => json!(record.name),
        "cpu" => json!(cpu),
        "memoryGib" => json!(memory),
        "diskGib" => json!(disk),
        "createdAt" => json!(iso_millis(record.created_at)),
        _ => json!(iso_millis(record.activity.last())),
    }
}

/// Numbers by value, strings byte by byte (ISO timestamps sort as times).
fn compare(a: &Value, b: &Value) -> Ordering {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        _ => a
            .as_str()
            .unwrap_or_default()
            .cmp(b.as_str().unwrap_or_default()),
    }
}

fn decode_cursor(text: &str) -> Option<(Value, String)> {
    let bytes = STANDARD.decode(text).ok()?;
    let value: Value = serde_json::from_slice(&bytes).ok()?;
    let id = value.get("id")?.as_str()?.to_owned();
    Some((value.get("sortValue").cloned().unwrap_or(Value::Null), id))
}

/// How a raw key names its parameter.
enum Shape {
    Plain,
    /// `key[]`.
    Array,
    /// `key[sub]`.
    Object,
}

/// Groups pairs as the extended parser does: a repeated key (or `key[]`)
/// is an array, `key[sub]` an object.
fn group(pairs: &[(String, String)]) -> BTreeMap<String, Param> {
    let mut params: BTreeMap<String, Param> = BTreeMap::new();
    for (raw, value) in pairs {
        let (key, shape) = match raw.split_once('[') {
            None => (raw.as_str(), Shape::Plain),
            Some((base, "]")) => (base, Shape::Array),
            Some((base, _)) => (base, Shape::Object),
        };
        let next = match (params.remove(key), shape) {
            (Some(Param::Nested), _) | (_, Shape::Object) => Param::Nested,
            (None, Shape::Plain) => Param::One(value.clone()),
            (None, Shape::Array) => Param::Many(vec![value.clone()]),
            (Some(Param::One(first)), _) => Param::Many(vec![first, value.clone()]),
            (Some(Param::Many(mut all)), _) => {
                all.push(value.clone());
                Param::Many(all)
            }
        };
        params.insert(key.to_owned(), next);
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    #[test]
    fn repeated_and_bracketed_keys_are_arrays() {
        let params = group(&pairs(
            "labels=a%3Db&labels=c%3Dd&states[]=started&id=x&name[a]=b",
        ));
        assert_eq!(
            params["labels"],
            Param::Many(vec!["a=b".into(), "c=d".into()])
        );
        assert_eq!(params["states"], Param::Many(vec!["started".into()]));
        assert_eq!(params["id"], Param::One("x".into()));
        assert_eq!(params["name"], Param::Nested);
    }

    #[test]
    fn labels_are_one_json_object() {
        assert!(parse(&pairs("labels=%7B%22a%22%3A%22b%22%7D")).is_ok());
        let repeated = parse(&pairs("labels=a%3Db&labels=c%3Dd")).unwrap_err();
        assert_eq!(repeated.message, "labels must be a string");
        let not_json = parse(&pairs("labels=a%3Db")).unwrap_err();
        assert_eq!(not_json.message, "Invalid labels JSON format");
    }

    #[test]
    fn the_pipe_names_every_bad_parameter() {
        let refusal = parse(&pairs("limit=500&states=running&order=up")).unwrap_err();
        assert_eq!(refusal.status, http::StatusCode::BAD_REQUEST);
        assert!(refusal.message.starts_with("limit must not be greater than 200, each value must be one of the following values: creating,"));
        assert!(
            refusal
                .message
                .ends_with("order must be one of the following values: asc, desc")
        );
    }

    #[test]
    fn cursors_are_base64_json() {
        let text = STANDARD.encode(r#"{"sortValue":"2024-01-01T00:00:00.000Z","id":"x"}"#);
        assert_eq!(
            decode_cursor(&text),
            Some((json!("2024-01-01T00:00:00.000Z"), "x".to_owned()))
        );
        assert_eq!(decode_cursor("not base64!"), None);
        assert!(
            parse(&pairs("cursor=%21"))
                .unwrap_err()
                .message
                .starts_with("Invalid cursor provided")
        );
    }
}
