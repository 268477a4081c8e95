//! [`KubernetesConfig`]: what silo's own settings add to the cluster's
//! client configuration (which comes the way every Kubernetes client finds
//! it: `KUBECONFIG` or `~/.kube/config`, else the pod's service account):
//! the namespace, how the agent is reached, where the agent comes from
//! when the image does not carry it, and the NetworkPolicy to write.

use std::path::Path;

/// The namespace sandboxes go in (the kubeconfig context's otherwise).
pub const ENV_NAMESPACE: &str = "SILO_KUBERNETES_NAMESPACE";
/// How the agent is reached: `auto` (the default), `pod-ip` or
/// `port-forward`.
pub const ENV_REACH: &str = "SILO_KUBERNETES_REACH";
/// An image holding the agent at [`AGENT_IMAGE_PATH`], copied into each
/// pod by an init container; unset, the sandbox's image must carry the
/// agent (`silo image bake`).
pub const ENV_AGENT_IMAGE: &str = "SILO_KUBERNETES_AGENT_IMAGE";
/// `KEY=VALUE`: write a NetworkPolicy with each pod admitting the agent's
/// port only from pods labelled so; `on` admits [`CONTROLLER_LABEL`];
/// unset or `off`, none is written.
pub const ENV_NETWORK_POLICY: &str = "SILO_KUBERNETES_NETWORK_POLICY";
/// Where an agent image keeps the agent.
pub const AGENT_IMAGE_PATH: &str = "/silo-agent";
/// The label of the pods a default NetworkPolicy admits: silo controllers
/// running in the cluster (Onyx's api_server, a harness's pod).
pub const CONTROLLER_LABEL: (&str, &str) = ("silo.role", "controller");
/// The service account token a pod in a cluster is given.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// How silo reaches a pod's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// At the pod's address: silo runs inside the cluster's network.
    PodIp,
    /// Through the API server's port-forward: silo runs outside it.
    PortForward,
}

impl Reach {
    /// Its name in [`ENV_REACH`] and `silo doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reach::PodIp => "pod-ip",
            Reach::PortForward => "port-forward",
        }
    }
}

/// silo's settings for its Kubernetes backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// The namespace asked for; the client configuration's when `None`.
    pub namespace: Option<String>,
    /// How the agent is reached; chosen by where silo runs when `None`.
    pub reach: Option<Reach>,
    /// The agent image an init container copies the agent from.
    pub agent_image: Option<String>,
    /// The label (key, value) of the pods admitted to the agent's port by
    /// a NetworkPolicy silo writes with each pod; none written when `None`.
    pub admit: Option<(String, String)>,
}

/// A setting of silo's Kubernetes backend that cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{variable}={value:?}: {reason}")]
pub struct KubernetesConfigError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// Why it cannot be used.
    pub reason: &'static str,
}

impl KubernetesConfig {
    /// The settings in the environment.
    pub fn from_env() -> Result<Self, KubernetesConfigError> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The settings `var` gives (a test's environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, KubernetesConfigError> {
        let bad = |variable, value: String, reason| KubernetesConfigError {
            variable,
            value,
            reason,
        };
        let namespace = var(ENV_NAMESPACE).map(|ns| ns.trim().to_owned());
        if let Some(ns) = &namespace {
            if !is_dns_label(ns) {
                return Err(bad(
                    ENV_NAMESPACE,
                    ns.clone(),
                    "a namespace is a DNS label: lowercase letters, digits and '-', at most 63",
                ));
            }
        }
        let reach = match var(ENV_REACH).as_deref().map(str::trim) {
            None | Some("auto") => None,
            Some("pod-ip") => Some(Reach::PodIp),
            Some("port-forward") => Some(Reach::PortForward),
            Some(other) => {
                return Err(bad(
                    ENV_REACH,
                    other.to_owned(),
                    "it is auto, pod-ip or port-forward",
                ));
            }
        };
        let admit = match var(ENV_NETWORK_POLICY).as_deref().map(str::trim) {
            None | Some("off") => None,
            Some("on") => Some((CONTROLLER_LABEL.0.to_owned(), CONTROLLER_LABEL.1.to_owned())),
            Some(text) => match text.split_once('=') {
                Some((key, value)) if !key.trim().is_empty() => {
                    Some((key.trim().to_owned(), value.trim().to_owned()))
                }
                _ => {
                    return Err(bad(
                        ENV_NETWORK_POLICY,
                        text.to_owned(),
                        "it is on, off, or the KEY=VALUE label of the pods admitted",
                    ));
                }
            },
        };
        Ok(Self {
            namespace,
            reach,
            agent_image: var(ENV_AGENT_IMAGE).map(|image| image.trim().to_owned()),
            admit,
        })
    }

    /// The environment's settings with the namespace `namespace` (a
    /// `--namespace` flag).
    pub fn in_namespace(namespace: &str) -> Result<Self, KubernetesConfigError> {
        let namespace = namespace.to_owned();
        Self::from_vars(|name| {
            if name == ENV_NAMESPACE {
                Some(namespace.clone())
            } else {
                std::env::var(name).ok().filter(|v| !v.trim().is_empty())
            }
        })
    }

    /// How the agent is reached: as asked, else at the pod's address when
    /// silo runs in a pod of the cluster with no kubeconfig named (as the
    /// client then configures itself from the service account), else
    /// through port-forward.
    pub fn reach(&self) -> Reach {
        self.reach.unwrap_or_else(|| {
            let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                && std::env::var_os("KUBECONFIG").is_none()
                && Path::new(SERVICE_ACCOUNT_TOKEN).exists();
            if in_cluster {
                Reach::PodIp
            } else {
                Reach::PortForward
            }
        })
    }
}

/// Whether there is a cluster to ask at all: a kubeconfig named or in the
/// home, or a service account; a gc on a machine with none sweeps nothing.
pub fn cluster_configured() -> bool {
    let named = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let in_home =
        std::env::var_os("HOME").is_some_and(|home| Path::new(&home).join(".kube/config").exists());
    named || in_home || Path::new(SERVICE_ACCOUNT_TOKEN).exists()
}

/// A DNS-1123 label, as namespaces and pod names are.
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<KubernetesConfig, KubernetesConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        KubernetesConfig::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn settings_are_read_and_bad_ones_named() {
        let c = config(&[]).unwrap();
        assert_eq!(c.namespace, None);
        assert_eq!(c.admit, None);
        let c = config(&[
            (ENV_NAMESPACE, "sandboxes"),
            (ENV_REACH, "pod-ip"),
            (ENV_NETWORK_POLICY, "on"),
        ])
        .unwrap();
        assert_eq!(c.namespace.as_deref(), Some("sandboxes"));
        assert_eq!(c.reach(), Reach::PodIp);
        assert_eq!(
            c.admit,
            Some(("silo.role".to_owned(), "controller".to_owned()))
        );
        let c = config(&[(ENV_NETWORK_POLICY, "app=api-server")]).unwrap();
        assert_eq!(c.admit, Some(("app".to_owned(), "api-server".to_owned())));
        let err = config(&[(ENV_REACH, "tunnel")]).unwrap_err();
        assert!(err.to_string().contains(ENV_REACH), "{err}");
        let err = config(&[(ENV_NAMESPACE, "Bad_NS")]).unwrap_err();
        assert!(err.to_string().contains("DNS label"), "{err}");
        assert!(config(&[(ENV_NETWORK_POLICY, "=x")]).is_err());
    }
}
