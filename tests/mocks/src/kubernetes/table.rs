//! Server-side printing: the `meta.k8s.io/v1` `Table` kubectl asks for
//! (`Accept: application/json;as=Table;…`) when it prints `get`, with the
//! columns the API server prints for pods (NAME, READY, STATUS, RESTARTS,
//! AGE, and IP, NODE, NOMINATED NODE, READINESS GATES under `-o wide`),
//! Secrets, NetworkPolicies and namespaces. Each row carries the object's
//! metadata, the whole object or nothing, as `includeObject` asks.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use serde_json::{Value, json};

use super::model::age;

/// Whether an `Accept` header asks for a table.
pub fn wanted(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .next()
            .is_some_and(|first| first.contains("as=Table"))
    })
}

/// What each row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Include {
    /// Nothing.
    None,
    /// `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl Include {
    /// From the query's `includeObject`.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

/// Objects the mock prints.
pub trait Printable: serde::Serialize {
    /// The columns: name, description, priority (1: only with `-o wide`).
    const COLUMNS: &'static [(&'static str, &'static str, u8)];
    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
    /// The object's cells, one per column.
    fn cells(&self) -> Vec<Value>;
}

/// A table of `items` at resource version `revision`.
pub fn table<T: Printable>(items: &[T], revision: u64, include: Include) -> Value {
    let columns: Vec<Value> = T::COLUMNS
        .iter()
        .map(|(name, description, priority)| {
            json!({
                "name": name,
                "type": "string",
                "format": if *name == "Name" { "name" } else { "" },
                "description": description,
                "priority": priority,
            })
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let object = match include {
                Include::None => Value::Null,
                Include::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": item.meta(),
                }),
                Include::Object => serde_json::to_value(item).unwrap_or(Value::Null),
            };
            json!({"cells": item.cells(), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": revision.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

const NAME: (&str, &str, u8) = ("Name", "The object's name, unique in its namespace.", 0);
const AGE: (&str, &str, u8) = ("Age", "Time since the object was created.", 0);

fn name_cell(meta: &ObjectMeta) -> Value {
    Value::from(meta.name.clone().unwrap_or_default())
}

fn age_cell(created: Option<&Time>) -> Value {
    Value::from(created.map_or_else(|| "<unknown>".to_owned(), |t| human(age(t))))
}

/// A duration as kubectl prints ages (`42s`, `3m12s`, `5h`, `2d3h`).
pub fn human(elapsed: Duration) -> String {
    let s = elapsed.as_secs();
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        let rest = s % 60;
        if rest == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rest}s")
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        let rest = m % 60;
        if rest == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rest}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        let rest = h % 24;
        if rest == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rest}h")
        }
    } else if d < 730 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

/// A pod's STATUS as kubectl prints it: the first init container not done
/// (`Init:0/1`, `Init:Error`), else a waiting or terminated container's
/// reason, else the phase; `Terminating` once deletion is asked.
pub fn pod_reason(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let mut reason = status
        .reason
        .clone()
        .or_else(|| status.phase.clone())
        .unwrap_or_else(|| "Pending".to_owned());
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len);
    let mut initializing = false;
    for (i, c) in status.init_container_statuses.iter().flatten().enumerate() {
        let state = c.state.clone().unwrap_or_default();
        if let Some(done) = &state.terminated {
            if done.exit_code == 0 {
                continue;
            }
            reason = match &done.reason {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => format!("Init:ExitCode:{}", done.exit_code),
            };
        } else if let Some(r) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.clone())
            .filter(|r| !r.is_empty() && r != "PodInitializing")
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{i}/{inits}");
        }
        initializing = true;
        break;
    }
    if !initializing {
        let mut running = false;
        for c in status.container_statuses.iter().flatten().rev() {
            let state = c.state.clone().unwrap_or_default();
            if let Some(r) = state
                .waiting
                .and_then(|w| w.reason)
                .filter(|r| !r.is_empty())
            {
                reason = r;
            } else if let Some(done) = state.terminated {
                reason = done
                    .reason
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| format!("ExitCode:{}", done.exit_code));
            } else if c.ready && state.running.is_some() {
                running = true;
            }
        }
        if reason == "Completed" && running {
            reason = "Running".to_owned();
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        reason = "Terminating".to_owned();
    }
    reason
}

impl Printable for Pod {
    const COLUMNS: &'static [(&'static str, &'static str, u8)] = &[
        NAME,
        ("Ready", "Containers ready of all the pod's containers.", 0),
        (
            "Status",
            "The pod's state, summed up from its containers'.",
            0,
        ),
        (
            "Restarts",
            "How often the pod's containers were restarted.",
            0,
        ),
        AGE,
        ("IP", "The pod's address.", 1),
        ("Node", "The node the pod runs on.", 1),
        ("Nominated Node", "The node the pod is nominated for.", 1),
        ("Readiness Gates", "The pod's readiness gates.", 1),
    ];

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn cells(&self) -> Vec<Value> {
        let status = self.status.clone().unwrap_or_default();
        let containers = status.container_statuses.clone().unwrap_or_default();
        let total = self.spec.as_ref().map_or(0, |s| s.containers.len());
        let ready = containers.iter().filter(|c| c.ready).count();
        let restarts: i32 = containers.iter().map(|c| c.restart_count).sum();
        let none = || "<none>".to_owned();
        vec![
            name_cell(&self.metadata),
            Value::from(format!("{ready}/{total}")),
            Value::from(pod_reason(self)),
            Value::from(restarts.to_string()),
            age_cell(self.metadata.creation_timestamp.as_ref()),
            Value::from(status.pod_ip.clone().unwrap_or_else(none)),
            Value::from(
                self.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_else(none),
            ),
            Value::from(none()),
            Value::from(none()),
        ]
    }
}

impl Printable for Secret {
    const COLUMNS: &'static [(&'static str, &'static str, u8)] = &[
        NAME,
        ("Type", "The Secret's type.", 0),
        ("Data", "How many keys the Secret holds.", 0),
        AGE,
    ];

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn cells(&self) -> Vec<Value> {
        vec![
            name_cell(&self.metadata),
            Value::from(self.type_.clone().unwrap_or_else(|| "Opaque".to_owned())),
            Value::from(self.data.as_ref().map_or(0, |d| d.len()).to_string()),
            age_cell(self.metadata.creation_timestamp.as_ref()),
        ]
    }
}

/// A label selector as kubectl prints one (`app=web,tier in (a,b)`).
fn selector_text(selector: &LabelSelector) -> String {
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        terms.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    if terms.is_empty() {
        "<none>".to_owned()
    } else {
        terms.join(",")
    }
}

impl Printable for NetworkPolicy {
    const COLUMNS: &'static [(&'static str, &'static str, u8)] = &[
        NAME,
        ("Pod-Selector", "The pods the policy applies to.", 0),
        AGE,
    ];

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn cells(&self) -> Vec<Value> {
        let selector = self
            .spec
            .as_ref()
            .and_then(|s| s.pod_selector.as_ref())
            .map(selector_text);
        vec![
            name_cell(&self.metadata),
            Value::from(selector.unwrap_or_else(|| "<none>".to_owned())),
            age_cell(self.metadata.creation_timestamp.as_ref()),
        ]
    }
}

impl Printable for Namespace {
    const COLUMNS: &'static [(&'static str, &'static str, u8)] =
        &[NAME, ("Status", "The namespace's phase.", 0), AGE];

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn cells(&self) -> Vec<Value> {
        vec![
            name_cell(&self.metadata),
            Value::from("Active"),
            age_cell(self.metadata.creation_timestamp.as_ref()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, PodSpec, PodStatus,
    };

    fn status(name: &str, state: ContainerState, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            ready,
            ..Default::default()
        }
    }

    #[test]
    fn ages_print_as_kubectl_prints_them() {
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(192)), "3m12s");
        assert_eq!(human(Duration::from_secs(3600 * 5)), "5h");
        assert_eq!(human(Duration::from_secs(86400 * 2 + 3600 * 3)), "2d3h");
    }

    #[test]
    fn pod_status_follows_the_containers() {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Default::default()],
                init_containers: Some(vec![Default::default()]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                init_container_statuses: Some(vec![status(
                    "init",
                    ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    },
                    false,
                )]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_reason(&pod), "Init:0/1");
        let status_mut = pod.status.as_mut().unwrap();
        status_mut.init_container_statuses = Some(vec![status(
            "init",
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )]);
        assert_eq!(pod_reason(&pod), "Init:Error");
        let status_mut = pod.status.as_mut().unwrap();
        status_mut.init_container_statuses = None;
        status_mut.container_statuses = Some(vec![status(
            "app",
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ErrImageNeverPull".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )]);
        assert_eq!(pod_reason(&pod), "ErrImageNeverPull");
        let cells = pod.cells();
        assert_eq!(cells[1], "0/1");
    }
}
