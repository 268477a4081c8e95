//! Watches of pods: `GET …/pods?watch=true`, a stream of newline-delimited
//! `WatchEvent` JSON (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`)
//! for the pods a watch selects (namespace, `labelSelector`,
//! `fieldSelector`), as the API's watch cache sends them:
//!
//! - without a `resourceVersion` (or with `0`), first an `ADDED` for every
//!   selected pod, then the changes;
//! - with one, the changes after it, replayed from the store's history; a
//!   version older than the history is an `ERROR` event with a `410`
//!   `Expired` status;
//! - `sendInitialEvents=true` ends the first `ADDED`s with a `BOOKMARK`
//!   annotated `k8s.io/initial-events-end`;
//! - a pod whose change makes it enter the selection is `ADDED`, one that
//!   leaves it `DELETED`;
//! - the stream ends after `timeoutSeconds` (at most [`MAX_WATCH`]), when a
//!   watcher falls [`super::store::EVENT_BUFFER`] events behind, or when the
//!   mock stops.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::selectors::{FieldSelector, LabelSelector};
use super::status::expired;
use super::store::{EventType, PodEvent, Store};
use crate::http::{Body, BoxError, with_body};

/// The longest a watch lasts (the API server's default is 30 to 60 minutes).
pub const MAX_WATCH: Duration = Duration::from_secs(1800);
/// Lines a watch may have queued for a slow reader before it waits.
const QUEUED_LINES: usize = 64;

/// Fields a pod may be selected by (`fieldSelector`).
pub const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

/// A pod's field, as field selectors compare it (empty when unset).
pub fn pod_field(pod: &Pod, field: &str) -> String {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let text = match field {
        "metadata.name" => pod.metadata.name.clone(),
        "metadata.namespace" => pod.metadata.namespace.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.restartPolicy" => spec.and_then(|s| s.restart_policy.clone()),
        "spec.schedulerName" => spec.and_then(|s| s.scheduler_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "spec.hostNetwork" => Some(
            spec.and_then(|s| s.host_network)
                .unwrap_or(false)
                .to_string(),
        ),
        "status.phase" => status.and_then(|s| s.phase.clone()),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()),
        "status.nominatedNodeName" => status.and_then(|s| s.nominated_node_name.clone()),
        _ => None,
    };
    text.unwrap_or_default()
}

/// Which pods a list or watch selects.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selection {
    /// Whether `pod` is selected.
    pub fn selects(&self, pod: &Pod) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|n| pod.metadata.namespace.as_deref() == Some(n))
            && self.labels.matches(pod.metadata.labels.as_ref())
            && self.fields.matches(|f| pod_field(pod, f))
    }
}

/// How a watch was asked for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The pods it selects.
    pub selection: Selection,
    /// Resume after this resource version; `None` starts with the pods now.
    pub from: Option<u64>,
    /// When it ends.
    pub timeout: Duration,
    /// `sendInitialEvents=true`: end the first events with a bookmark.
    pub initial_events: bool,
}

/// The event a watcher of `selection` sees for `event`, if any.
fn seen(selection: &Selection, event: &PodEvent) -> Option<(&'static str, Arc<Pod>)> {
    let now = selection.selects(&event.after);
    let before = event.before.as_ref().is_some_and(|b| selection.selects(b));
    let kind = match (event.kind, before, now) {
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        (EventType::Deleted, b, n) if b || n => "DELETED",
        _ => return None,
    };
    Some((kind, event.after.clone()))
}

/// One line of the stream.
fn line(kind: &str, pod: &Pod) -> Bytes {
    let event = match kind {
        "ADDED" => WatchEvent::Added(pod),
        "MODIFIED" => WatchEvent::Modified(pod),
        _ => WatchEvent::Deleted(pod),
    };
    let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The bookmark that ends the initial events (with kind and apiVersion, as
/// the API sends it and clients parse it).
fn initial_events_end(revision: u64) -> Bytes {
    let event = json!({
        "type": "BOOKMARK",
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "resourceVersion": revision.to_string(),
                "creationTimestamp": null,
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
            "spec": {"containers": null},
            "status": {},
        },
    });
    let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Answers a watch of pods.
pub fn pods(store: &Store, request: WatchRequest, cancel: CancellationToken) -> Response<Body> {
    let (lines, queued) = mpsc::channel::<Bytes>(QUEUED_LINES);
    match store.subscribe(request.from) {
        Err(too_old) => {
            let event: WatchEvent<Pod> =
                WatchEvent::ErrorStatus(expired(too_old.asked, too_old.oldest));
            let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
            bytes.push(b'\n');
            // One line fits the queue; the stream ends when the sender goes.
            let _ = lines.try_send(Bytes::from(bytes));
        }
        Ok(subscription) => {
            let mut first = Vec::new();
            match request.from {
                None => {
                    for pod in &subscription.current {
                        if request.selection.selects(pod) {
                            first.push(line("ADDED", pod));
                        }
                    }
                    if request.initial_events {
                        first.push(initial_events_end(subscription.revision));
                    }
                }
                Some(_) => {
                    for event in &subscription.replay {
                        if let Some((kind, pod)) = seen(&request.selection, event) {
                            first.push(line(kind, &pod));
                        }
                    }
                }
            }
            tokio::spawn(stream(
                lines,
                first,
                subscription.live,
                subscription.revision,
                request,
                cancel,
            ));
        }
    }
    let frames = futures_util::stream::unfold(queued, |mut queued| async move {
        queued
            .recv()
            .await
            .map(|bytes| (Ok::<_, BoxError>(Frame::data(bytes)), queued))
    });
    with_body(
        StatusCode::OK,
        "application/json",
        StreamBody::new(frames.boxed()).boxed_unsync(),
    )
}

async fn stream(
    lines: mpsc::Sender<Bytes>,
    first: Vec<Bytes>,
    mut live: broadcast::Receiver<Arc<PodEvent>>,
    seen_up_to: u64,
    request: WatchRequest,
    cancel: CancellationToken,
) {
    let deadline = tokio::time::sleep(request.timeout.min(MAX_WATCH));
    tokio::pin!(deadline);
    for bytes in first {
        if lines.send(bytes).await.is_err() {
            return;
        }
    }
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            () = &mut deadline => return,
            () = lines.closed() => return,
            event = live.recv() => match event {
                Ok(event) => event,
                // Behind or shut down: the client lists again and resumes.
                Err(_) => return,
            },
        };
        if event.revision <= seen_up_to {
            continue;
        }
        if let Some((kind, pod)) = seen(&request.selection, &event) {
            if lines.send(line(kind, &pod)).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(labels: &[(&str, &str)]) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[test]
    fn selectors_turn_changes_into_entries_and_exits() {
        let selection = Selection {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Default::default()
        };
        let event = |kind, before: Option<Arc<Pod>>, after| PodEvent {
            revision: 1,
            kind,
            before,
            after,
        };
        let web = pod(&[("app", "web")]);
        let db = pod(&[("app", "db")]);
        let kind = |e: PodEvent| seen(&selection, &e).map(|(k, _)| k);
        assert_eq!(
            kind(event(EventType::Added, None, web.clone())),
            Some("ADDED")
        );
        assert_eq!(kind(event(EventType::Added, None, db.clone())), None);
        assert_eq!(
            kind(event(EventType::Modified, Some(web.clone()), web.clone())),
            Some("MODIFIED")
        );
        assert_eq!(
            kind(event(EventType::Modified, Some(db.clone()), web.clone())),
            Some("ADDED")
        );
        assert_eq!(
            kind(event(EventType::Modified, Some(web.clone()), db.clone())),
            Some("DELETED")
        );
        assert_eq!(
            kind(event(EventType::Deleted, Some(web.clone()), web)),
            Some("DELETED")
        );
    }

    #[test]
    fn lines_are_watch_events() {
        let text = line("ADDED", &pod(&[]));
        let parsed: WatchEvent<Pod> = serde_json::from_slice(&text).unwrap();
        assert!(matches!(parsed, WatchEvent::Added(_)));
        assert!(text.ends_with(b"\n"));
        let bookmark: serde_json::Value = serde_json::from_slice(&initial_events_end(7)).unwrap();
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "7");
    }
}
