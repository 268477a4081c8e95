//! Namespaces: the mock needs no Namespace object before objects are made
//! in one; any valid name answers as an `Active` namespace, and the list
//! holds the usual four and every namespace something was made in.

use http::{Response, StatusCode};
use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Namespace, NamespaceSpec, NamespaceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Time};

use super::Cluster;
use super::api::ListQuery;
use super::model::label_problem;
use super::status::{Kind, not_found, object};
use super::table;
use crate::http::{Body, json};

/// How messages name namespaces.
pub const NAMESPACES: Kind = Kind {
    kind: "Namespace",
    resource: "namespaces",
    group: "",
};
/// The namespaces every cluster has.
const BUILT_IN: [&str; 4] = ["default", "kube-node-lease", "kube-public", "kube-system"];

fn namespace(name: &str, created: &Time) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            creation_timestamp: Some(created.clone()),
            labels: Some([("kubernetes.io/metadata.name".to_owned(), name.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(NamespaceSpec {
            finalizers: Some(vec!["kubernetes".to_owned()]),
        }),
        status: Some(NamespaceStatus {
            phase: Some("Active".to_owned()),
            ..Default::default()
        }),
    }
}

/// `GET /api/v1/namespaces/{name}`.
pub fn get(cluster: &Cluster, name: &str, query: &ListQuery) -> Response<Body> {
    if label_problem(name).is_some() {
        return not_found(&NAMESPACES, name);
    }
    let item = namespace(name, &cluster.started);
    if query.table {
        return json(
            StatusCode::OK,
            &table::table(&[item], cluster.store.revision(), query.include),
        );
    }
    object(StatusCode::OK, &item)
}

/// `GET /api/v1/namespaces`.
pub fn list(cluster: &Cluster, query: &ListQuery) -> Response<Body> {
    let mut names: Vec<String> = BUILT_IN.iter().map(|n| (*n).to_owned()).collect();
    names.extend(cluster.store.namespaces());
    names.sort();
    names.dedup();
    let items: Vec<Namespace> = names
        .iter()
        .map(|n| namespace(n, &cluster.started))
        .collect();
    let revision = cluster.store.revision();
    if query.table {
        return json(
            StatusCode::OK,
            &table::table(&items, revision, query.include),
        );
    }
    object(
        StatusCode::OK,
        &List {
            items,
            metadata: ListMeta {
                resource_version: Some(revision.to_string()),
                ..Default::default()
            },
        },
    )
}
