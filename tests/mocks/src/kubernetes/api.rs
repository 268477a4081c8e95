//! The API server's front: bearer-token authentication (`401` with a
//! `Status` otherwise), the query options lists and watches share, and
//! routing of every served path to the module that owns it. Paths the
//! mock does not serve are the API's `404`; a served path with a verb it
//! does not serve is `405`.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::discovery::{self, NETWORKING};
use super::model::Key;
use super::status::{bad_request, method_not_allowed, no_such_path, unauthorized};
use super::table::{self, Include};
use super::{Cluster, exec, namespaces, objects, pods, portforward};
use crate::http::{Body, Handler, header, query_pairs, query_value, read_body};
use crate::secret::same_secret;

/// Largest request body the API takes (as the API server's 3 MiB).
pub const MAX_BODY: usize = 3 << 20;

/// The query options of lists, watches, gets and deletes.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `labelSelector`.
    pub label_selector: String,
    /// `fieldSelector`.
    pub field_selector: String,
    /// `watch=true` (or `1`, `True`, …).
    pub watch: bool,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// `sendInitialEvents=true`.
    pub send_initial_events: bool,
    /// Whether the `Accept` header asks for a table.
    pub table: bool,
    /// `includeObject` of a table's rows.
    pub include: Include,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn parse_bool(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" | "" => Ok(false),
        _ => Err(format!(
            "invalid value for {name}: {value:?} is not a boolean"
        )),
    }
}

impl ListQuery {
    /// Reads the options from a query and the `Accept` header.
    pub fn parse(pairs: &[(String, String)], accept: Option<&str>) -> Result<Self, String> {
        let value = |name: &'static str| query_value(pairs, name);
        let number = |name: &'static str| -> Result<Option<i64>, String> {
            value(name)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| format!("invalid value for {name}: {v:?}"))
                })
                .transpose()
        };
        Ok(Self {
            label_selector: value("labelSelector").unwrap_or_default().to_owned(),
            field_selector: value("fieldSelector").unwrap_or_default().to_owned(),
            watch: parse_bool("watch", value("watch").unwrap_or_default())?,
            resource_version: value("resourceVersion").map(str::to_owned),
            timeout: number("timeoutSeconds")?
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or_default())),
            send_initial_events: parse_bool(
                "sendInitialEvents",
                value("sendInitialEvents").unwrap_or_default(),
            )?,
            table: table::wanted(accept),
            include: Include::parse(value("includeObject")),
            dry_run: value("dryRun") == Some("All"),
            grace_period_seconds: number("gracePeriodSeconds")?,
        })
    }
}

/// The API server.
pub struct Api {
    /// The cluster it answers for.
    pub cluster: Arc<Cluster>,
    /// The one bearer token it accepts.
    pub token: String,
}

impl Api {
    fn authorized<B>(&self, request: &Request<B>) -> bool {
        header(request, "authorization")
            .and_then(|value| value.split_once(' '))
            .is_some_and(|(scheme, token)| {
                scheme.eq_ignore_ascii_case("bearer") && same_secret(token.trim(), &self.token)
            })
    }
}

impl Handler for Api {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        if !self.authorized(&request) {
            return unauthorized();
        }
        let path = request.uri().path().to_owned();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let pairs = query_pairs(&request);
        let query = match ListQuery::parse(&pairs, header(&request, "accept")) {
            Ok(query) => query,
            Err(message) => return bad_request(message),
        };
        let method = request.method().clone();
        let cluster = &self.cluster;
        match (&method, segments.as_slice()) {
            (&Method::GET, ["version"]) => discovery::version(),
            (&Method::GET, ["api"]) => discovery::core_versions(cluster.api_addr),
            (&Method::GET, ["api", "v1"]) => discovery::core_resources(),
            (&Method::GET, ["apis"]) => discovery::groups(),
            (&Method::GET, ["apis", NETWORKING]) => discovery::networking(),
            (&Method::GET, ["apis", NETWORKING, "v1"]) => discovery::networking_resources(),
            (_, ["api", "v1", "namespaces", ns, "pods", name, "portforward"]) => {
                let key = Key::new(ns, name);
                if matches!(method, Method::GET | Method::POST) {
                    portforward::handle(cluster, &key, request, &pairs)
                } else {
                    method_not_allowed()
                }
            }
            (_, ["api", "v1", "namespaces", ns, "pods", name, "exec"]) => {
                let key = Key::new(ns, name);
                if matches!(method, Method::GET | Method::POST) {
                    exec::handle(cluster, &key, request, &pairs)
                } else {
                    method_not_allowed()
                }
            }
            (_, ["api", "v1", rest @ ..]) => {
                let rest: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
                self.core(method, &rest, request, &pairs, &query).await
            }
            (_, ["apis", NETWORKING, "v1", rest @ ..]) => {
                let rest: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
                self.networking(method, &rest, request, &query).await
            }
            _ => no_such_path(),
        }
    }
}

impl Api {
    async fn body(request: Request<Incoming>) -> Result<bytes::Bytes, Response<Body>> {
        read_body(request.into_body(), MAX_BODY)
            .await
            .map_err(|e| bad_request(e.to_string()))
    }

    async fn core(
        &self,
        method: Method,
        rest: &[String],
        request: Request<Incoming>,
        pairs: &[(String, String)],
        query: &ListQuery,
    ) -> Response<Body> {
        let cluster = &self.cluster;
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        match (method, rest.as_slice()) {
            (Method::GET, ["pods"]) => pods::list(cluster, None, query),
            (Method::GET, ["secrets"]) => objects::list::<Secret>(cluster, None, query),
            (Method::GET, ["namespaces"]) => namespaces::list(cluster, query),
            (Method::GET, ["namespaces", ns]) => namespaces::get(cluster, ns, query),
            (Method::GET, ["namespaces", ns, "pods"]) => pods::list(cluster, Some(ns), query),
            (Method::POST, ["namespaces", ns, "pods"]) => match Self::body(request).await {
                Ok(body) => pods::create(cluster, ns, &body, query.dry_run),
                Err(answer) => answer,
            },
            (
                Method::GET,
                ["namespaces", ns, "pods", name] | ["namespaces", ns, "pods", name, "status"],
            ) => pods::get(cluster, &Key::new(ns, name), query),
            (Method::DELETE, ["namespaces", ns, "pods", name]) => match Self::body(request).await {
                Ok(body) => pods::delete(cluster, &Key::new(ns, name), &body, query),
                Err(answer) => answer,
            },
            (Method::GET, ["namespaces", ns, "pods", name, "log"]) => {
                let tail = query_value(pairs, "tailLines").and_then(|t| t.parse().ok());
                pods::log(
                    cluster,
                    &Key::new(ns, name),
                    query_value(pairs, "container"),
                    tail,
                )
                .await
            }
            (Method::GET, ["namespaces", ns, "secrets"]) => {
                objects::list::<Secret>(cluster, Some(ns), query)
            }
            (Method::POST, ["namespaces", ns, "secrets"]) => match Self::body(request).await {
                Ok(body) => objects::create::<Secret>(cluster, ns, &body, query.dry_run),
                Err(answer) => answer,
            },
            (Method::GET, ["namespaces", ns, "secrets", name]) => {
                objects::get::<Secret>(cluster, &Key::new(ns, name), query)
            }
            (Method::DELETE, ["namespaces", ns, "secrets", name]) => {
                objects::delete::<Secret>(cluster, &Key::new(ns, name), query.dry_run)
            }
            (Method::PATCH, ["namespaces", ns, "secrets", name]) => {
                let content_type = header(&request, "content-type").map(str::to_owned);
                match Self::body(request).await {
                    Ok(body) => objects::patch::<Secret>(
                        cluster,
                        &Key::new(ns, name),
                        content_type.as_deref(),
                        &body,
                        query.dry_run,
                    ),
                    Err(answer) => answer,
                }
            }
            (
                _,
                ["pods" | "secrets" | "namespaces"]
                | ["namespaces", _]
                | ["namespaces", _, "pods" | "secrets"]
                | ["namespaces", _, "pods" | "secrets", _]
                | ["namespaces", _, "pods", _, "status" | "log"],
            ) => method_not_allowed(),
            _ => no_such_path(),
        }
    }

    async fn networking(
        &self,
        method: Method,
        rest: &[String],
        request: Request<Incoming>,
        query: &ListQuery,
    ) -> Response<Body> {
        let cluster = &self.cluster;
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        match (method, rest.as_slice()) {
            (Method::GET, ["networkpolicies"]) => {
                objects::list::<NetworkPolicy>(cluster, None, query)
            }
            (Method::GET, ["namespaces", ns, "networkpolicies"]) => {
                objects::list::<NetworkPolicy>(cluster, Some(ns), query)
            }
            (Method::POST, ["namespaces", ns, "networkpolicies"]) => {
                match Self::body(request).await {
                    Ok(body) => objects::create::<NetworkPolicy>(cluster, ns, &body, query.dry_run),
                    Err(answer) => answer,
                }
            }
            (Method::GET, ["namespaces", ns, "networkpolicies", name]) => {
                objects::get::<NetworkPolicy>(cluster, &Key::new(ns, name), query)
            }
            (Method::DELETE, ["namespaces", ns, "networkpolicies", name]) => {
                objects::delete::<NetworkPolicy>(cluster, &Key::new(ns, name), query.dry_run)
            }
            (
                _,
                ["networkpolicies"]
                | ["namespaces", _, "networkpolicies"]
                | ["namespaces", _, "networkpolicies", _],
            ) => method_not_allowed(),
            _ => no_such_path(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn queries_read_as_the_api_reads_them() {
        let query = ListQuery::parse(
            &pairs(&[
                ("watch", "True"),
                ("labelSelector", "app=web"),
                ("timeoutSeconds", "5"),
                ("resourceVersion", "12"),
                ("dryRun", "All"),
            ]),
            Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
        )
        .unwrap();
        assert!(query.watch && query.table && query.dry_run);
        assert_eq!(query.timeout, Some(Duration::from_secs(5)));
        assert_eq!(query.resource_version.as_deref(), Some("12"));
        assert!(ListQuery::parse(&pairs(&[("watch", "yes")]), None).is_err());
        assert!(
            !ListQuery::parse(&[], Some("application/json"))
                .unwrap()
                .table
        );
    }
}
