//! What a pod's status says, as the kubelet builds it: a new pod's
//! (`Pending` at its address, each container waiting), a container's
//! waiting state, the QoS class the resources make, and the conditions
//! with their transition times (a condition keeps its time until its value
//! changes).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateWaiting, ContainerStatus, HostIP, PodCondition, PodIP,
    PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::addresses::HOST_IP;
use super::model::now;

pub fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..Default::default()
    }
}

pub fn container_status(c: &Container, reason: &str) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        started: Some(false),
        restart_count: 0,
        state: Some(waiting(reason, None)),
        ..Default::default()
    }
}

/// The QoS class the API derives from the containers' resources.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut any, mut guaranteed) = (false, true);
    for c in all {
        let resources = c.resources.clone().unwrap_or_default();
        let limits = resources.limits.unwrap_or_default();
        let requests = resources.requests.unwrap_or_default();
        for name in ["cpu", "memory"] {
            let (limit, request) = (limits.get(name), requests.get(name));
            any |= limit.is_some() || request.is_some();
            guaranteed &= limit.is_some() && request.is_none_or(|r| Some(r) == limit);
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

pub fn initial_status(spec: &PodSpec, ip: Ipv4Addr) -> PodStatus {
    let inits = spec.init_containers.clone().unwrap_or_default();
    let app_reason = if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    PodStatus {
        phase: Some("Pending".to_owned()),
        host_ip: Some(HOST_IP.to_string()),
        host_ips: Some(vec![HostIP {
            ip: HOST_IP.to_string(),
        }]),
        pod_ip: Some(ip.to_string()),
        pod_ips: Some(vec![PodIP { ip: ip.to_string() }]),
        start_time: Some(now()),
        qos_class: Some(qos_class(spec).to_owned()),
        init_container_statuses: (!inits.is_empty()).then(|| {
            inits
                .iter()
                .map(|c| container_status(c, "PodInitializing"))
                .collect()
        }),
        container_statuses: Some(
            spec.containers
                .iter()
                .map(|c| container_status(c, app_reason))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Each condition's last value and when it took it.
#[derive(Debug, Default)]
pub struct Conditions(BTreeMap<&'static str, (bool, Time)>);

impl Conditions {
    /// The condition `kind` with `value` (and, when false, `why`: reason
    /// and message), its transition time kept while the value is.
    pub fn set(
        &mut self,
        kind: &'static str,
        value: bool,
        why: Option<(&str, String)>,
    ) -> PodCondition {
        let at = match self.0.get(kind) {
            Some((last, at)) if *last == value => at.clone(),
            _ => {
                let at = now();
                self.0.insert(kind, (value, at.clone()));
                at
            }
        };
        let (reason, message) = match why.filter(|_| !value) {
            Some((reason, message)) => (Some(reason.to_owned()), Some(message)),
            None => (None, None),
        };
        PodCondition {
            type_: kind.to_owned(),
            status: if value { "True" } else { "False" }.to_owned(),
            last_transition_time: Some(at),
            reason,
            message,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn with_resources(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> PodSpec {
        let map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        PodSpec {
            containers: vec![Container {
                resources: Some(ResourceRequirements {
                    limits: map(limits),
                    requests: map(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn qos_follows_the_resources() {
        assert_eq!(qos_class(&with_resources(&[], &[])), "BestEffort");
        assert_eq!(
            qos_class(&with_resources(&[("cpu", "1"), ("memory", "1Gi")], &[])),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&with_resources(&[("cpu", "1")], &[])),
            "Burstable"
        );
        assert_eq!(
            qos_class(&with_resources(
                &[("cpu", "1"), ("memory", "1Gi")],
                &[("cpu", "500m")]
            )),
            "Burstable"
        );
    }

    #[test]
    fn a_new_pod_is_pending_at_its_address() {
        let spec = PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("img".into()),
                ..Default::default()
            }],
            init_containers: Some(vec![Container {
                name: "init".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let status = initial_status(&spec, Ipv4Addr::new(127, 77, 9, 2));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.pod_ip.as_deref(), Some("127.77.9.2"));
        assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
        let app = &status.container_statuses.unwrap()[0];
        assert_eq!(
            app.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("PodInitializing")
        );
    }
}
