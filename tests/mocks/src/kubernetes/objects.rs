//! The resources the mock stores and answers without running anything
//! (Secrets, NetworkPolicies): create (metadata filled, a name from
//! `generateName`, `409` on a taken name), get, list (label selector,
//! field selector on `metadata.name` and `metadata.namespace`), a JSON
//! merge patch (RFC 7386; other patch types `415`), delete.
//! Each kind adds its own checks and normalisation through [`Stored`].
//! Watches of them are not modelled (`400`).

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use k8s_openapi::{List, ListableResource, Metadata};

use super::Cluster;
use super::admission::decode;
use super::api::ListQuery;
use super::model::{Key, generated_name, new_uid, now, subdomain_problem};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{
    FieldProblem, Kind, already_exists, bad_request, internal, invalid, not_found, object,
};
use super::store::Table;
use super::table::{self, Printable};
use crate::http::{Body, json};

/// Fields a stored object may be selected by.
const FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// A kind the mock stores as it is given.
pub trait Stored:
    Metadata<Ty = ObjectMeta>
    + ListableResource
    + Printable
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
{
    /// How messages name it.
    const NAMES: Kind;
    /// Where the store keeps it.
    const TABLE: Table<Self>;
    /// Checks it and brings it to its stored form (the problems, if any).
    fn admit(&mut self) -> Vec<FieldProblem>;
}

/// `POST …/{resource}`.
pub fn create<T: Stored>(
    cluster: &Arc<Cluster>,
    namespace: &str,
    body: &Bytes,
    dry_run: bool,
) -> Response<Body> {
    let mut item: T = match decode(body) {
        Ok(item) => item,
        Err(message) => return bad_request(message),
    };
    let meta = item.metadata_mut();
    match meta.namespace.as_deref() {
        Some(given) if !given.is_empty() && given != namespace => {
            return bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        _ => meta.namespace = Some(namespace.to_owned()),
    }
    if meta.resource_version.is_some() {
        return bad_request("resourceVersion should not be set on objects to be created");
    }
    if meta.name.as_deref().is_none_or(str::is_empty) {
        match meta.generate_name.clone().filter(|g| !g.is_empty()) {
            Some(prefix) => match generated_name(&prefix) {
                Ok(name) => meta.name = Some(name),
                Err(error) => return internal(error.to_string()),
            },
            None => {
                return invalid(
                    &T::NAMES,
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
    let name = meta.name.clone().unwrap_or_default();
    let mut problems = Vec::new();
    if let Some(why) = subdomain_problem(&name) {
        problems.push(FieldProblem::invalid("metadata.name", &name, &why));
    }
    match new_uid() {
        Ok(uid) => meta.uid = Some(uid),
        Err(error) => return internal(error.to_string()),
    }
    meta.creation_timestamp = Some(now());
    problems.extend(item.admit());
    if !problems.is_empty() {
        return invalid(&T::NAMES, &name, &problems);
    }
    if dry_run {
        return object(StatusCode::CREATED, &item);
    }
    match cluster.store.create(T::TABLE, item) {
        Some(made) => object(StatusCode::CREATED, &made),
        None => already_exists(&T::NAMES, &name),
    }
}

/// `GET …/{resource}/{name}`.
pub fn get<T: Stored>(cluster: &Cluster, key: &Key, query: &ListQuery) -> Response<Body> {
    match cluster.store.get(T::TABLE, key) {
        Some(item) if query.table => json(
            StatusCode::OK,
            &table::table(&[item], cluster.store.revision(), query.include),
        ),
        Some(item) => object(StatusCode::OK, &item),
        None => not_found(&T::NAMES, &key.name),
    }
}

/// `GET …/{resource}` in a namespace or across all.
pub fn list<T: Stored>(
    cluster: &Cluster,
    namespace: Option<&str>,
    query: &ListQuery,
) -> Response<Body> {
    if query.watch {
        return bad_request(format!(
            "the mock Kubernetes watches pods only, not {}",
            T::NAMES.resource
        ));
    }
    let labels = match LabelSelector::parse(&query.label_selector) {
        Ok(labels) => labels,
        Err(message) => return bad_request(message),
    };
    let fields = match FieldSelector::parse(&query.field_selector, FIELDS) {
        Ok(fields) => fields,
        Err(message) => return bad_request(message),
    };
    let (items, revision) = cluster.store.list(T::TABLE, namespace);
    let items: Vec<T> = items
        .into_iter()
        .filter(|item| {
            let meta = item.metadata();
            labels.matches(meta.labels.as_ref())
                && fields.matches(|f| match f {
                    "metadata.name" => meta.name.clone().unwrap_or_default(),
                    _ => meta.namespace.clone().unwrap_or_default(),
                })
        })
        .collect();
    listing(items, revision, query)
}

/// A list's answer: a `Table` when the client asked for one (kubectl
/// get), else the kind's `List` at the store's resource version.
pub fn listing<T: ListableResource + Printable>(
    items: Vec<T>,
    revision: u64,
    query: &ListQuery,
) -> Response<Body> {
    if query.table {
        return json(
            StatusCode::OK,
            &table::table(&items, revision, query.include),
        );
    }
    let list = List {
        items,
        metadata: ListMeta {
            resource_version: Some(revision.to_string()),
            ..Default::default()
        },
    };
    object(StatusCode::OK, &list)
}

/// `PATCH …/{resource}/{name}` with `application/merge-patch+json`: the
/// object as it is now. The name, namespace and uid cannot change.
pub fn patch<T: Stored>(
    cluster: &Cluster,
    key: &Key,
    content_type: Option<&str>,
    body: &Bytes,
    dry_run: bool,
) -> Response<Body> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or_default();
    if media != MERGE_PATCH {
        return json(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!(
                    "the mock Kubernetes takes {MERGE_PATCH} patches only, not {media:?}"
                ),
                "reason": "UnsupportedMediaType", "code": 415,
            }),
        );
    }
    let change: serde_json::Value = match serde_json::from_slice(body) {
        Ok(change) => change,
        Err(error) => return bad_request(format!("the patch is not JSON: {error}")),
    };
    // The refusal is boxed: an answer is large beside the object.
    let patched = |old: &T| -> Result<T, Box<Response<Body>>> {
        let refuse = |answer| Box::new(answer);
        let mut value = serde_json::to_value(old).map_err(|e| refuse(internal(e.to_string())))?;
        merge(&mut value, &change);
        let mut new: T =
            serde_json::from_value(value).map_err(|e| refuse(bad_request(e.to_string())))?;
        let (meta, was) = (new.metadata_mut(), old.metadata());
        if meta.name != was.name || meta.namespace != was.namespace || meta.uid != was.uid {
            return Err(refuse(bad_request(
                "a patch may not change the name, namespace or uid",
            )));
        }
        meta.creation_timestamp.clone_from(&was.creation_timestamp);
        let problems = new.admit();
        if !problems.is_empty() {
            return Err(refuse(invalid(&T::NAMES, &key.name, &problems)));
        }
        Ok(new)
    };
    let answer = if dry_run {
        cluster.store.get(T::TABLE, key).map(|old| patched(&old))
    } else {
        cluster.store.update(T::TABLE, key, patched)
    };
    match answer {
        Some(Ok(new)) => object(StatusCode::OK, &new),
        Some(Err(refused)) => *refused,
        None => not_found(&T::NAMES, &key.name),
    }
}

/// The media type of a JSON merge patch.
const MERGE_PATCH: &str = "application/merge-patch+json";

/// RFC 7386: objects merge key by key, `null` removes, anything else
/// replaces.
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(fields) = target {
        for (key, value) in changes {
            if value.is_null() {
                fields.remove(key);
            } else {
                merge(
                    fields.entry(key.clone()).or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
    }
}

/// `DELETE …/{resource}/{name}`: the object as it was.
pub fn delete<T: Stored>(cluster: &Cluster, key: &Key, dry_run: bool) -> Response<Body> {
    let found = if dry_run {
        cluster.store.get(T::TABLE, key)
    } else {
        cluster.store.delete(T::TABLE, key)
    };
    match found {
        Some(item) => object(StatusCode::OK, &item),
        None => not_found(&T::NAMES, &key.name),
    }
}
