//! The objects one sandbox is in a cluster, made from its spec: its pod
//! (the agent as PID 1), the Secret holding its key, and the NetworkPolicy
//! silo writes when asked or when the sandbox has no network.
//!
//! The mapping, setting by setting (what has none was refused by the spec
//! check, by name):
//!
//! | spec | pod |
//! |---|---|
//! | image | the container's `image` (which carries the agent, or an init container copies it in) |
//! | workload, restart, idle timeout, workdir | the agent's flags in `command` |
//! | env | the container's `env` |
//! | user `UID[:GID]` | `securityContext.runAsUser` / `runAsGroup` |
//! | cpus, memory | `resources.limits` (`cpu` in millicores, `memory` in bytes) |
//! | cap-add, privileged, new-privileges | `securityContext.capabilities.add`, `privileged`, `allowPrivilegeEscalation` |
//! | runtime | `runtimeClassName` |
//! | network none | a NetworkPolicy with no egress rule |
//! | labels | the pod's labels, beside silo's |

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, Pod, PodSpec,
    ResourceRequirements, Secret, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config::AGENT_IMAGE_PATH;
use crate::backend::labels::{LABEL_HOME, LABEL_SANDBOX_ID};
use crate::backend::remote::AGENT_PORT;
use crate::image::BAKED_AGENT_PATH;
use crate::spec::SandboxSpec;

/// Where silo's own directory is in a pod: an emptyDir, left out of
/// snapshots (the agent's journals, the agent an init container copied).
pub const SILO_DIR: &str = "/.silo";
/// Where the Secret with the key is mounted (read-only, so the agent keeps
/// the file; only silo's pods mount it).
pub const SECRET_DIR: &str = "/.silo/secret";
/// The key's file name in the Secret.
pub const KEY_ITEM: &str = "key";
/// Where an init container puts the agent.
pub const COPIED_AGENT_PATH: &str = "/.silo/silo-agent";
/// The name of the sandbox's container in its pod.
pub const CONTAINER: &str = "sandbox";
/// Labels every object silo makes carries, so `kubectl get -l` finds them.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "silo");
/// The grace a pod's deletion gives the agent to end its commands.
pub const GRACE_SECS: i64 = 5;

/// One sandbox's objects, all named alike.
#[derive(Debug, Clone)]
pub struct Objects {
    /// The pod.
    pub pod: Pod,
    /// The Secret with the key.
    pub secret: Secret,
    /// The NetworkPolicy, when one is written.
    pub policy: Option<NetworkPolicy>,
}

/// What a pod is made of besides the spec.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// The name of the pod, its Secret and its policy.
    pub name: &'a str,
    /// The sandbox's spec.
    pub spec: &'a SandboxSpec,
    /// The image (the spec's, or the one a restore is made from).
    pub image: &'a str,
    /// silo's labels: the home's and the sandbox's, for selection.
    pub labels: BTreeMap<String, String>,
    /// silo's other marks (name, spec hash), which need not be label values.
    pub annotations: BTreeMap<String, String>,
    /// The sandbox's key, in hex.
    pub key_hex: String,
    /// The agent image an init container copies the agent from; the image
    /// carries it when `None`.
    pub agent_image: Option<&'a str>,
    /// The label (key, value) of the pods admitted to the agent's port.
    pub admit: Option<(&'a str, &'a str)>,
}

impl Plan<'_> {
    /// The pod, its Secret and its policy.
    pub fn objects(&self) -> Objects {
        Objects {
            pod: self.pod(),
            secret: self.secret(),
            policy: self.policy(),
        }
    }

    fn meta(&self) -> ObjectMeta {
        let mut labels = self.labels.clone();
        labels.insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
        ObjectMeta {
            name: Some(self.name.to_owned()),
            labels: Some(labels),
            annotations: Some(self.annotations.clone()),
            ..ObjectMeta::default()
        }
    }

    /// The agent's command line: listening on the pod's port, its key
    /// from the mounted Secret, the spec's flags and workload.
    fn command(&self) -> Vec<String> {
        let agent = if self.agent_image.is_some() {
            COPIED_AGENT_PATH
        } else {
            BAKED_AGENT_PATH
        };
        let mut argv: Vec<String> = vec![
            agent.to_owned(),
            "--listen".to_owned(),
            format!("tcp:0.0.0.0:{AGENT_PORT}"),
            "--key-file".to_owned(),
            format!("{SECRET_DIR}/{KEY_ITEM}"),
        ];
        argv.extend(crate::backend::agent_flags(self.spec, &self.spec.workload));
        argv
    }

    fn pod(&self) -> Pod {
        let spec = self.spec;
        let mut meta = self.meta();
        if let Some(labels) = meta.labels.as_mut() {
            for (key, value) in &spec.labels {
                labels.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        let mounts = vec![
            VolumeMount {
                name: "silo".into(),
                mount_path: SILO_DIR.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "silo-key".into(),
                mount_path: SECRET_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ];
        let limits: BTreeMap<String, Quantity> = [
            spec.milli_cpus.map(|m| ("cpu", format!("{m}m"))),
            spec.memory_bytes.map(|b| ("memory", b.to_string())),
        ]
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.to_owned(), Quantity(v)))
        .collect();
        let (run_as_user, run_as_group) = spec
            .user
            .as_deref()
            .and_then(numeric_user)
            .map_or((None, None), |(u, g)| (Some(u), g));
        let container = Container {
            name: CONTAINER.into(),
            image: Some(self.image.to_owned()),
            command: Some(self.command()),
            env: (!spec.env.is_empty()).then(|| {
                spec.env
                    .iter()
                    .map(|(name, value)| EnvVar {
                        name: name.clone(),
                        value: Some(value.clone()),
                        ..EnvVar::default()
                    })
                    .collect()
            }),
            ports: Some(vec![ContainerPort {
                name: Some("silo-agent".into()),
                container_port: i32::from(AGENT_PORT),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }]),
            resources: (!limits.is_empty()).then(|| ResourceRequirements {
                limits: Some(limits),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                run_as_user,
                run_as_group,
                privileged: spec.privileged.then_some(true),
                allow_privilege_escalation: Some(spec.new_privileges || spec.privileged),
                capabilities: (!spec.cap_add.is_empty()).then(|| Capabilities {
                    add: Some(spec.cap_add.clone()),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(mounts.clone()),
            ..Container::default()
        };
        let init_containers = self.agent_image.map(|image| {
            vec![Container {
                name: "silo-agent".into(),
                image: Some(image.to_owned()),
                command: Some(vec![
                    AGENT_IMAGE_PATH.to_owned(),
                    "--install-to".to_owned(),
                    COPIED_AGENT_PATH.to_owned(),
                ]),
                volume_mounts: Some(vec![mounts[0].clone()]),
                ..Container::default()
            }]
        });
        Pod {
            metadata: meta,
            spec: Some(PodSpec {
                containers: vec![container],
                init_containers,
                volumes: Some(vec![
                    Volume {
                        name: "silo".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    },
                    Volume {
                        name: "silo-key".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(self.name.to_owned()),
                            default_mode: Some(0o400),
                            ..SecretVolumeSource::default()
                        }),
                        ..Volume::default()
                    },
                ]),
                restart_policy: Some("Never".into()),
                runtime_class_name: spec.runtime.clone(),
                termination_grace_period_seconds: Some(GRACE_SECS),
                // What runs in a sandbox gets no credentials of the cluster.
                automount_service_account_token: Some(false),
                enable_service_links: Some(false),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn secret(&self) -> Secret {
        Secret {
            metadata: self.meta(),
            data: Some(BTreeMap::from([(
                KEY_ITEM.to_owned(),
                ByteString(format!("{}\n", self.key_hex).into_bytes()),
            )])),
            type_: Some("Opaque".into()),
            ..Secret::default()
        }
    }

    /// Admits the agent's port only from the pods named, and nothing out
    /// when the sandbox has no network; `None` when neither is asked.
    fn policy(&self) -> Option<NetworkPolicy> {
        let offline = self.spec.offline();
        if self.admit.is_none() && !offline {
            return None;
        }
        let selector = LabelSelector {
            match_labels: Some(BTreeMap::from([(
                LABEL_SANDBOX_ID.to_owned(),
                self.labels
                    .get(LABEL_SANDBOX_ID)
                    .cloned()
                    .unwrap_or_default(),
            )])),
            ..LabelSelector::default()
        };
        let ingress = self.admit.map(|(key, value)| {
            vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
                        ..LabelSelector::default()
                    }),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(i32::from(AGENT_PORT))),
                    protocol: Some("TCP".into()),
                    ..NetworkPolicyPort::default()
                }]),
            }]
        });
        let mut types = Vec::new();
        if ingress.is_some() {
            types.push("Ingress".to_owned());
        }
        if offline {
            types.push("Egress".to_owned());
        }
        Some(NetworkPolicy {
            metadata: self.meta(),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(selector),
                ingress,
                egress: offline.then(Vec::new),
                policy_types: Some(types),
            }),
        })
    }
}

/// `UID[:GID]` as numbers, which is all a pod's security context takes.
pub fn numeric_user(user: &str) -> Option<(i64, Option<i64>)> {
    let (uid, gid) = match user.split_once(':') {
        Some((uid, gid)) => (uid, Some(gid)),
        None => (user, None),
    };
    let uid = uid.parse().ok()?;
    let gid = match gid {
        Some(gid) => Some(gid.parse().ok()?),
        None => None,
    };
    Some((uid, gid))
}

/// Of silo's marks, those that select a sandbox's objects (and only this
/// home's): the labels its objects carry; the rest go in annotations.
pub fn selecting(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(key, _)| key.as_str() == LABEL_HOME || key.as_str() == LABEL_SANDBOX_ID)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The label selector of [`selecting`]'s labels.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    selecting(labels)
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::spec::BackendKind;

    fn plan<'a>(spec: &'a SandboxSpec, agent_image: Option<&'a str>) -> Plan<'a> {
        Plan {
            name: "silo-sbx-1-abcde",
            spec,
            image: "silo-base:agent",
            labels: BTreeMap::from([
                (LABEL_HOME.to_owned(), "h".to_owned()),
                (LABEL_SANDBOX_ID.to_owned(), "sbx-1".to_owned()),
            ]),
            annotations: BTreeMap::new(),
            key_hex: "00".repeat(32),
            agent_image,
            admit: None,
        }
    }

    #[test]
    fn the_spec_maps_onto_the_pod() {
        let mut spec = SandboxSpec::new(BackendKind::Kubernetes);
        spec.user = Some("1000:100".into());
        spec.milli_cpus = Some(500);
        spec.memory_bytes = Some(256 << 20);
        spec.env = BTreeMap::from([("A".into(), "1".into())]);
        spec.runtime = Some("gvisor".into());
        spec.cap_add = vec!["NET_RAW".into()];
        spec.workload = vec!["sleep".into(), "9".into()];
        let objects = plan(&spec, None).objects();
        let pod_spec = objects.pod.spec.unwrap();
        let container = &pod_spec.containers[0];
        let command = container.command.clone().unwrap();
        assert_eq!(command[0], BAKED_AGENT_PATH);
        assert!(command.ends_with(&["--".into(), "sleep".into(), "9".into()]));
        let limits = container.resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits["cpu"], Quantity("500m".into()));
        assert_eq!(limits["memory"], Quantity((256u64 << 20).to_string()));
        let security = container.security_context.clone().unwrap();
        assert_eq!(security.run_as_user, Some(1000));
        assert_eq!(security.run_as_group, Some(100));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(pod_spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(pod_spec.automount_service_account_token, Some(false));
        assert!(pod_spec.init_containers.is_none());
        assert!(objects.policy.is_none());
        let key = &objects.secret.data.unwrap()[KEY_ITEM];
        assert_eq!(key.0.len(), 65);
    }

    #[test]
    fn an_agent_image_is_copied_in_and_no_network_is_a_policy() {
        let mut spec = SandboxSpec::new(BackendKind::Kubernetes);
        spec.network = Some("none".into());
        let mut plan = plan(&spec, Some("silo-agent:1"));
        plan.admit = Some(("silo.role", "controller"));
        let objects = plan.objects();
        let pod_spec = objects.pod.spec.unwrap();
        let init = &pod_spec.init_containers.unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("silo-agent:1"));
        assert_eq!(
            pod_spec.containers[0].command.clone().unwrap()[0],
            COPIED_AGENT_PATH
        );
        let policy = objects.policy.unwrap().spec.unwrap();
        assert_eq!(
            policy.policy_types.unwrap(),
            ["Ingress".to_owned(), "Egress".to_owned()]
        );
        assert_eq!(policy.egress, Some(Vec::new()));
    }

    #[test]
    fn users_are_numeric_or_nothing() {
        assert_eq!(numeric_user("0"), Some((0, None)));
        assert_eq!(numeric_user("1000:1000"), Some((1000, Some(1000))));
        assert_eq!(numeric_user("ubuntu"), None);
        assert_eq!(numeric_user("1000:staff"), None);
    }
}
