//! Discovery, as much as kubectl and the client libraries read: the server
//! version, the core group (`/api`, `/api/v1`) with pods (and their
//! `exec`, `portforward`, `status` and `log` subresources), Secrets and
//! namespaces, and the groups (`/apis`) with `networking.k8s.io/v1`
//! NetworkPolicies. Every answer is the legacy (unaggregated) form, which
//! clients fall back to when the aggregated one is not offered. Verbs
//! list what the mock serves, nothing more.
//!
//! OpenAPI documents (`/openapi/v2`, `/openapi/v3`) are not served: `404`,
//! so kubectl needs `--validate=false` to create from a manifest.

use std::net::SocketAddr;

use http::{Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ServerAddressByClientCIDR,
};
use k8s_openapi::apimachinery::pkg::version::Info;

use super::status::object;
use crate::http::Body;

/// The Kubernetes version the mock follows (k8s-openapi's `v1_33`).
pub const MAJOR: &str = "1";
/// The minor version.
pub const MINOR: &str = "33";
/// The version string `/version` reports.
pub const GIT_VERSION: &str = "v1.33.0-silo-mock";
/// The NetworkPolicies' group.
pub const NETWORKING: &str = "networking.k8s.io";

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn resource(
    name: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    verbs: &[&str],
) -> APIResource {
    APIResource {
        name: name.to_owned(),
        singular_name: singular.to_owned(),
        namespaced,
        kind: kind.to_owned(),
        verbs: strings(verbs),
        ..Default::default()
    }
}

/// `GET /version`.
pub fn version() -> Response<Body> {
    let info = Info {
        major: MAJOR.to_owned(),
        minor: MINOR.to_owned(),
        git_version: GIT_VERSION.to_owned(),
        git_commit: "0000000000000000000000000000000000000000".to_owned(),
        git_tree_state: "clean".to_owned(),
        build_date: "2026-01-01T00:00:00Z".to_owned(),
        go_version: "go1.24.0".to_owned(),
        compiler: "gc".to_owned(),
        platform: "linux/amd64".to_owned(),
        ..Default::default()
    };
    object(StatusCode::OK, &info)
}

/// `GET /api`.
pub fn core_versions(server: SocketAddr) -> Response<Body> {
    let versions = APIVersions {
        versions: strings(&["v1"]),
        server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
            client_cidr: "0.0.0.0/0".to_owned(),
            server_address: server.to_string(),
        }],
    };
    object(StatusCode::OK, &versions)
}

/// `GET /api/v1`.
pub fn core_resources() -> Response<Body> {
    let mut pods = resource(
        "pods",
        "pod",
        "Pod",
        true,
        &["create", "delete", "get", "list", "watch"],
    );
    pods.short_names = Some(strings(&["po"]));
    pods.categories = Some(strings(&["all"]));
    let mut namespaces = resource(
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["get", "list"],
    );
    namespaces.short_names = Some(strings(&["ns"]));
    let list = APIResourceList {
        group_version: "v1".to_owned(),
        resources: vec![
            namespaces,
            pods,
            resource("pods/exec", "", "PodExecOptions", true, &["create", "get"]),
            resource("pods/log", "", "Pod", true, &["get"]),
            resource(
                "pods/portforward",
                "",
                "PodPortForwardOptions",
                true,
                &["create", "get"],
            ),
            resource("pods/status", "", "Pod", true, &["get"]),
            resource(
                "secrets",
                "secret",
                "Secret",
                true,
                &["create", "delete", "get", "list"],
            ),
        ],
    };
    object(StatusCode::OK, &list)
}

fn networking_version() -> GroupVersionForDiscovery {
    GroupVersionForDiscovery {
        group_version: format!("{NETWORKING}/v1"),
        version: "v1".to_owned(),
    }
}

fn networking_group() -> APIGroup {
    APIGroup {
        name: NETWORKING.to_owned(),
        versions: vec![networking_version()],
        preferred_version: Some(networking_version()),
        ..Default::default()
    }
}

/// `GET /apis`.
pub fn groups() -> Response<Body> {
    object(
        StatusCode::OK,
        &APIGroupList {
            groups: vec![networking_group()],
        },
    )
}

/// `GET /apis/networking.k8s.io`.
pub fn networking() -> Response<Body> {
    object(StatusCode::OK, &networking_group())
}

/// `GET /apis/networking.k8s.io/v1`.
pub fn networking_resources() -> Response<Body> {
    let mut policies = resource(
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        true,
        &["create", "delete", "get", "list"],
    );
    policies.short_names = Some(strings(&["netpol"]));
    let list = APIResourceList {
        group_version: format!("{NETWORKING}/v1"),
        resources: vec![policies],
    };
    object(StatusCode::OK, &list)
}
