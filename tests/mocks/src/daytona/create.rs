//! `POST /sandbox`'s body, `CreateSandbox`, read as the API reads it: the
//! validation pipe's type checks first (every failing field, in the DTO's
//! order, messages joined by `, `), then the controller's and the
//! service's checks in their order, each with its real message. What the
//! mock does not model (declarative builds, volumes, linked sandboxes) is
//! refused with `400` saying so, never silently ignored.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::Settings;
use super::network;
use super::store::{NewRecord, Refusal, SandboxClass};

/// The OS user when none is given.
pub const DEFAULT_USER: &str = "daytona";
/// `autoStopInterval` when none is given (minutes).
pub const DEFAULT_AUTO_STOP: i64 = 15;
/// `autoArchiveInterval` when none is given (minutes: 7 days).
pub const DEFAULT_AUTO_ARCHIVE: i64 = 7 * 24 * 60;
/// The longest `autoArchiveInterval` (the API's default `MAX_AUTO_ARCHIVE_INTERVAL`; 0 means it).
pub const MAX_AUTO_ARCHIVE: i64 = 43_200;
/// `autoDeleteInterval` when none is given (negative: never).
pub const DEFAULT_AUTO_DELETE: i64 = -1;

/// How a field is checked by the validation pipe.
#[derive(Clone, Copy)]
enum Kind {
    Text,
    Flag,
    Object,
    /// A number not below 0, and not above the bound if there is one.
    Amount(Option<f64>),
    Number,
    List,
}

/// `CreateSandbox`'s fields in the DTO's order, with their checks.
const FIELDS: [(&str, Kind); 29] = [
    ("name", Kind::Text),
    ("snapshot", Kind::Text),
    ("user", Kind::Text),
    ("env", Kind::Object),
    ("labels", Kind::Object),
    ("public", Kind::Flag),
    ("networkBlockAll", Kind::Flag),
    ("kvm", Kind::Flag),
    ("networkAllowList", Kind::Text),
    ("domainAllowList", Kind::Text),
    ("target", Kind::Text),
    ("cpu", Kind::Amount(None)),
    ("gpu", Kind::Amount(Some(1.0))),
    ("gpuType", Kind::List),
    ("memory", Kind::Amount(None)),
    ("disk", Kind::Amount(None)),
    ("autoStopInterval", Kind::Number),
    ("autoPauseInterval", Kind::Number),
    ("autoArchiveInterval", Kind::Number),
    ("autoDeleteInterval", Kind::Number),
    ("ttlMinutes", Kind::Number),
    ("queueTimeout", Kind::Number),
    ("volumes", Kind::List),
    ("secrets", Kind::List),
    ("buildInfo", Kind::Object),
    ("linkedSandbox", Kind::Text),
    ("outboundProxyUrl", Kind::Text),
    ("otelEndpointOverride", Kind::Text),
    ("spot", Kind::Flag),
];

/// Fields the mock does not model, refused when set to anything but
/// their defaults (absent, null, false, 0, empty).
const UNMODELLED: [(&str, &str); 6] = [
    ("autoPauseInterval", "autoPauseInterval (automatic pauses)"),
    ("ttlMinutes", "ttlMinutes (timed destruction)"),
    ("secrets", "secrets"),
    ("outboundProxyUrl", "outboundProxyUrl"),
    ("otelEndpointOverride", "otelEndpointOverride"),
    ("spot", "spot sandboxes"),
];

/// Reads and checks a create body; the record to make, or the API's refusal.
pub fn parse(body: &Value, settings: &Settings) -> Result<NewRecord, Refusal> {
    let empty = Map::new();
    let fields = match body {
        Value::Object(fields) => fields,
        // An empty body reads as `{}`.
        Value::Null => &empty,
        _ => return Err(Refusal::bad("body must be a JSON object")),
    };
    let present = |name: &str| fields.get(name).filter(|v| !v.is_null());
    let messages: Vec<String> = FIELDS
        .iter()
        .filter_map(|(name, kind)| present(name).and_then(|v| type_error(name, *kind, v)))
        .collect();
    if !messages.is_empty() {
        return Err(Refusal::bad(messages.join(", ")));
    }
    let text = |name: &str| present(name).and_then(Value::as_str).map(str::to_owned);
    let number = |name: &str| present(name).and_then(Value::as_f64);
    let truthy = |name: &str| number(name).is_some_and(|n| n != 0.0);

    if present("buildInfo").is_some() {
        if present("snapshot").is_some() {
            return Err(Refusal::bad(
                "Cannot specify a snapshot when using a build info entry",
            ));
        }
        return Err(Refusal::bad(
            "the mock does not model buildInfo (declarative builds); create from a snapshot",
        ));
    }
    if ["cpu", "gpu", "memory", "disk"].into_iter().any(truthy) {
        return Err(Refusal::bad(
            "Cannot specify Sandbox resources when using a snapshot",
        ));
    }
    if present("gpuType")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(Refusal::bad(
            "Cannot specify GPU type when creating sandbox from snapshot. GPU type is inherited from snapshot.",
        ));
    }
    let target = match text("target")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
    {
        None => settings.default_target().to_owned(),
        Some(target) if settings.targets.contains(&target) => target,
        Some(_) => {
            return Err(Refusal::new(
                http::StatusCode::NOT_FOUND,
                "Region not found",
            ));
        }
    };
    let snapshot = text("snapshot")
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| settings.default_snapshot.clone());
    let Some(image) = settings.snapshots.get(&snapshot) else {
        return Err(Refusal::bad(format!(
            "Snapshot {snapshot} not found. Did you add it through the Daytona Dashboard?"
        )));
    };
    for (name, what) in UNMODELLED {
        let set = present(name).is_some_and(|v| match v {
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        });
        if set {
            return Err(Refusal::bad(format!("the mock does not model {what}")));
        }
    }
    if present("linkedSandbox").is_some() {
        return Err(Refusal::bad("the mock does not model linked sandboxes"));
    }
    if present("volumes")
        .and_then(Value::as_array)
        .is_some_and(|v| !v.is_empty())
    {
        return Err(Refusal::bad("the mock does not model volumes"));
    }
    let network_allow_list = text("networkAllowList");
    if let Some(list) = &network_allow_list {
        network::check_network_allow_list(list).map_err(Refusal::bad)?;
    }
    let domain_allow_list = text("domainAllowList");
    if let Some(list) = &domain_allow_list {
        network::check_domain_allow_list(list).map_err(Refusal::bad)?;
    }
    let minutes = |name: &str| number(name).map(|n| n.trunc() as i64);
    let auto_stop = match minutes("autoStopInterval") {
        Some(m) if m < 0 => return Err(Refusal::bad("Auto-stop interval must be non-negative")),
        Some(m) => m,
        None => DEFAULT_AUTO_STOP,
    };
    let auto_archive = match minutes("autoArchiveInterval") {
        Some(m) if m < 0 => return Err(Refusal::bad("Auto-archive interval must be non-negative")),
        Some(0) => MAX_AUTO_ARCHIVE,
        Some(m) => m.min(MAX_AUTO_ARCHIVE),
        None => DEFAULT_AUTO_ARCHIVE,
    };
    let sandbox_class = if settings.vm_snapshots.contains(&snapshot) {
        SandboxClass::LinuxVm
    } else {
        SandboxClass::Container
    };
    Ok(NewRecord {
        name: text("name"),
        snapshot,
        sandbox_class,
        image: image.clone(),
        user: text("user")
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_USER.to_owned()),
        env: strings(present("env")),
        labels: strings(present("labels")),
        public: present("public").and_then(Value::as_bool).unwrap_or(false),
        network_block_all: present("networkBlockAll")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        kvm: present("kvm").and_then(Value::as_bool).unwrap_or(false),
        network_allow_list,
        domain_allow_list,
        target,
        auto_stop,
        auto_archive,
        auto_delete: minutes("autoDeleteInterval").unwrap_or(DEFAULT_AUTO_DELETE),
    })
}

/// The validation pipe's message for a field of the wrong type, if it is.
fn type_error(name: &str, kind: Kind, value: &Value) -> Option<String> {
    let messages: Vec<String> = match kind {
        Kind::Text if !value.is_string() => vec![format!("{name} must be a string")],
        Kind::Flag if !value.is_boolean() => vec![format!("{name} must be a boolean value")],
        Kind::Object if !value.is_object() => vec![format!("{name} must be an object")],
        Kind::List if !value.is_array() => vec![format!("{name} must be an array")],
        Kind::Number if !value.is_number() => vec![not_a_number(name)],
        Kind::Amount(max) => {
            let Some(n) = value.as_f64() else {
                return Some(not_a_number(name));
            };
            let mut messages = Vec::new();
            if max.is_some_and(|m| n > m) {
                messages.push(format!(
                    "{name} must not be greater than {}",
                    max.unwrap_or_default()
                ));
            }
            if n < 0.0 {
                messages.push(format!("{name} must not be less than 0"));
            }
            messages
        }
        _ => Vec::new(),
    };
    (!messages.is_empty()).then(|| messages.join(", "))
}

fn not_a_number(name: &str) -> String {
    format!("{name} must be a number conforming to the specified constraints")
}

/// An `env` or `labels` object as strings (other JSON values as their text).
fn strings(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|fields| {
            fields
                .iter()
                .map(|(k, v)| {
                    let text = v
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string());
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn type_errors_come_in_the_dtos_order() {
        let body = json!({"public": "yes", "snapshot": 3, "gpu": 2, "cpu": -1});
        let messages: Vec<String> = FIELDS
            .iter()
            .filter_map(|(name, kind)| body.get(name).and_then(|v| type_error(name, *kind, v)))
            .collect();
        assert_eq!(
            messages,
            [
                "snapshot must be a string",
                "public must be a boolean value",
                "cpu must not be less than 0",
                "gpu must not be greater than 1",
            ]
        );
    }
}
