//! What the API server does to a pod before it is stored: decoding (a
//! body may leave out `kind` and `apiVersion`, not name another's),
//! validation as far as the mock honours the spec (one app container,
//! `env` values only, `emptyDir` and `secret` volumes, no sidecars; what
//! it does not model is refused with `422` naming the field, never run
//! otherwise), and the defaults it fills in.

use std::collections::BTreeSet;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::model::{label_problem, subdomain_problem};
use super::quantity;
use super::status::FieldProblem;
use super::volumes::contained;

/// The node every pod is bound to (`spec.nodeName`).
pub const NODE_NAME: &str = "silo-mock";
/// A pod's grace period unless its spec or the deletion says otherwise.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Reads an object from a request body as the API decodes it: `kind` and
/// `apiVersion` may be left out, but not be another's. The refusal is the
/// `400`'s message.
pub fn decode<T: serde::de::DeserializeOwned + k8s_openapi::Resource>(
    body: &Bytes,
) -> Result<T, String> {
    let refusal = |e: &dyn std::fmt::Display| {
        format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            T::KIND,
            T::VERSION,
            T::KIND
        )
    };
    let mut value: serde_json::Value = serde_json::from_slice(body).map_err(|e| refusal(&e))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(refusal(&"the body is not an object"));
    };
    fields
        .entry("apiVersion")
        .or_insert_with(|| T::API_VERSION.into());
    fields.entry("kind").or_insert_with(|| T::KIND.into());
    serde_json::from_value(value).map_err(|e| refusal(&e))
}

fn check_container(
    c: &Container,
    at: &str,
    volumes: &BTreeSet<String>,
    problems: &mut Vec<FieldProblem>,
) {
    if let Some(why) = label_problem(&c.name) {
        problems.push(FieldProblem::invalid(format!("{at}.name"), &c.name, &why));
    }
    if c.image.as_deref().is_none_or(str::is_empty) {
        problems.push(FieldProblem::required(format!("{at}.image")));
    }
    for (i, var) in c.env.iter().flatten().enumerate() {
        if var.name.is_empty() {
            problems.push(FieldProblem::required(format!("{at}.env[{i}].name")));
        }
        if var.value_from.is_some() {
            problems.push(FieldProblem::forbidden(
                format!("{at}.env[{i}].valueFrom"),
                "the mock Kubernetes models env values only, not valueFrom",
            ));
        }
    }
    if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        problems.push(FieldProblem::forbidden(
            format!("{at}.envFrom"),
            "the mock Kubernetes does not model envFrom",
        ));
    }
    for (i, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            problems.push(FieldProblem::invalid(
                format!("{at}.ports[{i}].containerPort"),
                &port.container_port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(protocol) = port
            .protocol
            .as_deref()
            .filter(|p| !matches!(*p, "TCP" | "UDP"))
        {
            problems.push(FieldProblem::not_supported(
                format!("{at}.ports[{i}].protocol"),
                protocol,
                &["TCP", "UDP"],
            ));
        }
    }
    for (i, mount) in c.volume_mounts.iter().flatten().enumerate() {
        if !volumes.contains(&mount.name) {
            problems.push(FieldProblem::not_found(
                format!("{at}.volumeMounts[{i}].name"),
                &mount.name,
            ));
        }
        if !mount.mount_path.starts_with('/') || mount.mount_path.contains(':') {
            problems.push(FieldProblem::invalid(
                format!("{at}.volumeMounts[{i}].mountPath"),
                &mount.mount_path,
                "the mock Kubernetes needs an absolute path without ':'",
            ));
        }
        if let Some(sub) = mount
            .sub_path
            .as_deref()
            .filter(|s| !s.is_empty() && !contained(s))
        {
            problems.push(FieldProblem::invalid(
                format!("{at}.volumeMounts[{i}].subPath"),
                sub,
                "must be a relative path without '..'",
            ));
        }
    }
    let limits = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    for (name, value) in &limits {
        if quantity::parse(&value.0).is_err() {
            problems.push(FieldProblem::invalid(
                format!("{at}.resources.limits[{name}]"),
                &value.0,
                &quantity::QuantityError.to_string(),
            ));
        }
    }
}

/// What the API (and the mock) would refuse in `pod`.
pub fn validate(pod: &Pod) -> Vec<FieldProblem> {
    let mut problems = Vec::new();
    let name = pod.metadata.name.clone().unwrap_or_default();
    if let Some(why) = subdomain_problem(&name) {
        problems.push(FieldProblem::invalid("metadata.name", &name, &why));
    }
    let Some(spec) = &pod.spec else {
        problems.push(FieldProblem::required("spec.containers"));
        return problems;
    };
    let mut volumes = BTreeSet::new();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        let at = format!("spec.volumes[{i}]");
        if !volumes.insert(volume.name.clone()) {
            problems.push(FieldProblem::invalid(
                format!("{at}.name"),
                &volume.name,
                "Duplicate value",
            ));
        }
        let mut as_json = serde_json::to_value(volume).unwrap_or_default();
        if let Some(fields) = as_json.as_object_mut() {
            fields.remove("name");
            let kinds: Vec<String> = fields.keys().cloned().collect();
            if kinds != ["emptyDir"] && kinds != ["secret"] {
                problems.push(FieldProblem::forbidden(
                    at.clone(),
                    &format!(
                        "the mock Kubernetes models emptyDir and secret volumes only, not {}",
                        kinds.join(", ")
                    ),
                ));
            }
        }
        if let Some(secret) = &volume.secret {
            if secret.secret_name.as_deref().is_none_or(str::is_empty) {
                problems.push(FieldProblem::required(format!("{at}.secret.secretName")));
            }
            for (j, item) in secret.items.iter().flatten().enumerate() {
                if !contained(&item.path) {
                    problems.push(FieldProblem::invalid(
                        format!("{at}.secret.items[{j}].path"),
                        &item.path,
                        "must be a relative path without '..'",
                    ));
                }
            }
        }
    }
    match spec.containers.len() {
        0 => problems.push(FieldProblem::required("spec.containers")),
        1 => {}
        _ => problems.push(FieldProblem::forbidden(
            "spec.containers",
            "the mock Kubernetes runs one app container per pod",
        )),
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let at = format!("spec.containers[{i}]");
        check_container(c, &at, &volumes, &mut problems);
        if !names.insert(c.name.clone()) {
            problems.push(FieldProblem::invalid(
                format!("{at}.name"),
                &c.name,
                "Duplicate value",
            ));
        }
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let at = format!("spec.initContainers[{i}]");
        check_container(c, &at, &volumes, &mut problems);
        if !names.insert(c.name.clone()) {
            problems.push(FieldProblem::invalid(
                format!("{at}.name"),
                &c.name,
                "Duplicate value",
            ));
        }
        if c.restart_policy.is_some() {
            problems.push(FieldProblem::forbidden(
                format!("{at}.restartPolicy"),
                "the mock Kubernetes does not model sidecar containers",
            ));
        }
    }
    if let Some(policy) = spec
        .restart_policy
        .as_deref()
        .filter(|p| !matches!(*p, "Always" | "OnFailure" | "Never"))
    {
        problems.push(FieldProblem::not_supported(
            "spec.restartPolicy",
            policy,
            &["Always", "OnFailure", "Never"],
        ));
    }
    problems
}

fn default_container(c: &mut Container) {
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".to_owned());
    c.termination_message_policy
        .get_or_insert_with(|| "File".to_owned());
    let image = c.image.clone().unwrap_or_default();
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(_, t)| t);
    c.image_pull_policy.get_or_insert_with(|| {
        if tag.is_none_or(|t| t == "latest") && !image.contains('@') {
            "Always".to_owned()
        } else {
            "IfNotPresent".to_owned()
        }
    });
    c.resources.get_or_insert_with(Default::default);
    for port in c.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".to_owned());
    }
}

/// The API server's defaults for a pod's spec, and its node.
pub fn default_spec(spec: &mut PodSpec) {
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_owned());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_GRACE_SECONDS);
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_owned());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".to_owned());
    spec.security_context.get_or_insert_with(Default::default);
    spec.service_account_name
        .get_or_insert_with(|| "default".to_owned());
    spec.service_account
        .get_or_insert_with(|| spec.service_account_name.clone().unwrap_or_default());
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    spec.preemption_policy
        .get_or_insert_with(|| "PreemptLowerPriority".to_owned());
    spec.node_name.get_or_insert_with(|| NODE_NAME.to_owned());
    spec.containers.iter_mut().for_each(default_container);
    spec.init_containers
        .iter_mut()
        .flatten()
        .for_each(default_container);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, Volume, VolumeMount};
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        decode(&Bytes::from(value.to_string())).unwrap_or_else(|_| panic!("not a pod"))
    }

    #[test]
    fn decoding_allows_a_missing_kind_but_not_another() {
        let without = pod(json!({"metadata": {"name": "a"}, "spec": {"containers": []}}));
        assert_eq!(without.metadata.name.as_deref(), Some("a"));
        assert!(decode::<Pod>(&Bytes::from(json!({"kind": "Secret"}).to_string())).is_err());
        assert!(decode::<Pod>(&Bytes::from_static(b"[1]")).is_err());
    }

    #[test]
    fn what_the_mock_does_not_model_is_refused_by_field() {
        let mut spec = PodSpec {
            containers: vec![
                Container {
                    name: "app".into(),
                    image: Some("silo-base:latest".into()),
                    env: Some(vec![EnvVar {
                        name: "X".into(),
                        value_from: Some(EnvVarSource::default()),
                        ..Default::default()
                    }]),
                    volume_mounts: Some(vec![VolumeMount {
                        name: "nope".into(),
                        mount_path: "/nope".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                Container {
                    name: "second".into(),
                    image: Some("silo-base:latest".into()),
                    ..Default::default()
                },
            ],
            volumes: Some(vec![Volume {
                name: "host".into(),
                host_path: Some(Default::default()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let mut subject = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(spec.clone()),
            ..Default::default()
        };
        let fields: Vec<String> = validate(&subject).into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            [
                "spec.volumes[0]",
                "spec.containers",
                "spec.containers[0].env[0].valueFrom",
                "spec.containers[0].volumeMounts[0].name",
            ]
        );
        spec.containers.truncate(1);
        spec.containers[0].env = None;
        spec.containers[0].volume_mounts = None;
        spec.volumes = None;
        subject.spec = Some(spec);
        assert!(validate(&subject).is_empty());
    }

    #[test]
    fn defaults_are_the_api_servers() {
        let mut spec = PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("silo-base:latest".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        default_spec(&mut spec);
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.node_name.as_deref(), Some(NODE_NAME));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
        let mut pinned = Container {
            image: Some("registry:5000/x:1.2".into()),
            ..Default::default()
        };
        default_container(&mut pinned);
        assert_eq!(pinned.image_pull_policy.as_deref(), Some("IfNotPresent"));
    }
}
