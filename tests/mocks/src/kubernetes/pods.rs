//! The pods resource: create ([`super::admission`]'s checks and defaults,
//! a name from `generateName`, an address, then the kubelet), get, list
//! (label and field selectors, or a watch), delete (with a grace period,
//! a pod stays listed while it terminates), the `status` subresource and
//! `log`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;

use super::Cluster;
use super::admission::{DEFAULT_GRACE_SECONDS, decode, default_spec, validate};
use super::api::ListQuery;
use super::kubelet;
use super::model::{Key, generated_name, new_uid, now};
use super::runtime;
use super::status::{
    FieldProblem, Kind, already_exists, bad_request, internal, invalid, not_found, object,
};
use super::table;
use super::watch::{self, POD_FIELDS, Selection, WatchRequest};
use crate::http::{Body, json, with_body};

/// How pods are named in messages.
pub const PODS: Kind = Kind {
    kind: "Pod",
    resource: "pods",
    group: "",
};
/// Tries at a free name for a `generateName` before `409`.
const GENERATE_TRIES: usize = 3;

/// `POST /api/v1/namespaces/{ns}/pods`.
pub fn create(
    cluster: &Arc<Cluster>,
    namespace: &str,
    body: &Bytes,
    dry_run: bool,
) -> Response<Body> {
    let mut pod: Pod = match decode(body) {
        Ok(pod) => pod,
        Err(message) => return bad_request(message),
    };
    match pod.metadata.namespace.as_deref() {
        Some(given) if !given.is_empty() && given != namespace => {
            return bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        _ => pod.metadata.namespace = Some(namespace.to_owned()),
    }
    if pod.metadata.resource_version.is_some() {
        return bad_request("resourceVersion should not be set on objects to be created");
    }
    let generate = pod.metadata.generate_name.clone().filter(|g| !g.is_empty());
    if pod.metadata.name.as_deref().is_none_or(str::is_empty) {
        match &generate {
            Some(prefix) => match generated_name(prefix) {
                Ok(name) => pod.metadata.name = Some(name),
                Err(error) => return internal(error.to_string()),
            },
            None => {
                return invalid(
                    &PODS,
                    "",
                    &[FieldProblem {
                        field: "metadata.name".to_owned(),
                        reason: "FieldValueRequired",
                        detail: "Required value: name or generateName is required".to_owned(),
                    }],
                );
            }
        }
    }
    let problems = validate(&pod);
    if !problems.is_empty() {
        return invalid(
            &PODS,
            pod.metadata.name.as_deref().unwrap_or_default(),
            &problems,
        );
    }
    if let Some(spec) = pod.spec.as_mut() {
        default_spec(spec);
    }
    match new_uid() {
        Ok(uid) => pod.metadata.uid = Some(uid),
        Err(error) => return internal(error.to_string()),
    }
    pod.metadata.creation_timestamp = Some(now());
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Pending".to_owned()),
        qos_class: None,
        ..Default::default()
    });
    if dry_run {
        return object(StatusCode::CREATED, &pod);
    }
    let Some(ip) = cluster.addresses.allocate() else {
        return internal(format!(
            "no pod address is left in {}",
            cluster.addresses.network()
        ));
    };
    for attempt in 0..GENERATE_TRIES {
        if let Some((made, stop)) = cluster.store.create_pod(pod.clone(), ip) {
            kubelet::start(cluster, made.clone(), ip, stop);
            return object(StatusCode::CREATED, &*made);
        }
        match (&generate, attempt + 1 < GENERATE_TRIES) {
            (Some(prefix), true) => match generated_name(prefix) {
                Ok(name) => pod.metadata.name = Some(name),
                Err(error) => {
                    cluster.addresses.release(ip);
                    return internal(error.to_string());
                }
            },
            _ => break,
        }
    }
    cluster.addresses.release(ip);
    already_exists(&PODS, pod.metadata.name.as_deref().unwrap_or_default())
}

/// `GET /api/v1/namespaces/{ns}/pods/{name}` (and `/status`).
pub fn get(cluster: &Cluster, key: &Key, query: &ListQuery) -> Response<Body> {
    match cluster.store.pod(key) {
        Some(pod) if query.table => json(
            StatusCode::OK,
            &table::table(&[(*pod).clone()], cluster.store.revision(), query.include),
        ),
        Some(pod) => object(StatusCode::OK, &*pod),
        None => not_found(&PODS, &key.name),
    }
}

/// `GET /api/v1/namespaces/{ns}/pods` and `GET /api/v1/pods`: a list or a watch.
pub fn list(cluster: &Cluster, namespace: Option<&str>, query: &ListQuery) -> Response<Body> {
    let fields = match super::selectors::FieldSelector::parse(&query.field_selector, POD_FIELDS) {
        Ok(fields) => fields,
        Err(message) => return bad_request(message),
    };
    let labels = match super::selectors::LabelSelector::parse(&query.label_selector) {
        Ok(labels) => labels,
        Err(message) => return bad_request(message),
    };
    let selection = Selection {
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
    };
    if query.watch {
        let from = match query.resource_version.as_deref() {
            None | Some("" | "0") => None,
            Some(text) => match text.parse() {
                Ok(revision) => Some(revision),
                Err(_) => return bad_request(format!("invalid resource version: {text}")),
            },
        };
        let request = WatchRequest {
            selection,
            from,
            timeout: query.timeout.unwrap_or(watch::MAX_WATCH),
            initial_events: query.send_initial_events,
        };
        return watch::pods(&cluster.store, request, cluster.cancel.clone());
    }
    let (pods, revision) = cluster.store.pods(namespace);
    let items: Vec<Pod> = pods
        .iter()
        .filter(|p| selection.selects(p))
        .map(|p| (**p).clone())
        .collect();
    super::objects::listing(items, revision, query)
}

/// The grace period of a deletion: the body's, else the query's, else the spec's.
fn grace_of(pod: &Pod, options: &DeleteOptions, query: Option<i64>) -> Duration {
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    let seconds = options
        .grace_period_seconds
        .or(query)
        .filter(|s| *s >= 0)
        .unwrap_or(spec);
    Duration::from_secs(u64::try_from(seconds).unwrap_or_default())
}

/// `DELETE /api/v1/namespaces/{ns}/pods/{name}`.
pub fn delete(cluster: &Cluster, key: &Key, body: &Bytes, query: &ListQuery) -> Response<Body> {
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(options) => options,
            Err(error) => return bad_request(format!("DeleteOptions cannot be decoded: {error}")),
        }
    };
    let Some(pod) = cluster.store.pod(key) else {
        return not_found(&PODS, &key.name);
    };
    if let Some(uid) = options
        .preconditions
        .as_ref()
        .and_then(|p| p.uid.as_deref())
    {
        if pod.metadata.uid.as_deref() != Some(uid) {
            return super::status::failure(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on pods {:?}: Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    key.name,
                    pod.metadata.uid.clone().unwrap_or_default()
                ),
                None,
            );
        }
    }
    if query.dry_run || options.dry_run.as_ref().is_some_and(|d| !d.is_empty()) {
        return object(StatusCode::OK, &*pod);
    }
    let grace = grace_of(&pod, &options, query.grace_period_seconds);
    match cluster.store.delete_pod(key, grace) {
        Some(pod) => object(StatusCode::OK, &*pod),
        None => not_found(&PODS, &key.name),
    }
}

/// `GET /api/v1/namespaces/{ns}/pods/{name}/log`: the container's output so
/// far (`container`, `tailLines`; `follow` answers what is there and ends).
pub async fn log(
    cluster: &Cluster,
    key: &Key,
    container: Option<&str>,
    tail: Option<u32>,
) -> Response<Body> {
    let Some(pod) = cluster.store.pod(key) else {
        return not_found(&PODS, &key.name);
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let wanted = match container {
        Some(name) => name.to_owned(),
        None if spec.containers.len() == 1 => spec.containers[0].name.clone(),
        None => {
            return bad_request(format!(
                "a container name must be specified for pod {}",
                key.name
            ));
        }
    };
    let status = pod.status.clone().unwrap_or_default();
    let found = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == wanted)
        .cloned();
    let Some(found) = found else {
        return bad_request(format!(
            "container {wanted} is not valid for pod {}",
            key.name
        ));
    };
    let Some(id) = found
        .container_id
        .as_deref()
        .and_then(|id| id.strip_prefix("docker://"))
    else {
        let reason = found
            .state
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason)
            .unwrap_or_else(|| "ContainerCreating".to_owned());
        return bad_request(format!(
            "container {wanted:?} in pod {:?} is waiting to start: {reason}",
            key.name
        ));
    };
    match runtime::logs(&cluster.engine, id, tail).await {
        Ok(bytes) => with_body(StatusCode::OK, "text/plain", crate::http::full(bytes)),
        Err(error) => internal(error.to_string()),
    }
}
