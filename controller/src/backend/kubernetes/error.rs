//! [`KubernetesError`]: why a Kubernetes backend operation failed, each
//! naming what was asked of which object and what the cluster answered.

use super::config::KubernetesConfigError;
use crate::backend::remote::error::RemoteError;

/// Why a Kubernetes operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubernetesError {
    /// silo's own settings are wrong.
    #[error(transparent)]
    Config(#[from] KubernetesConfigError),
    /// No cluster configuration could be found or read.
    #[error(
        "no Kubernetes cluster is configured (KUBECONFIG, ~/.kube/config, or a pod's \
         service account): {0}"
    )]
    NoCluster(String),
    /// The API server answered an error, or could not be reached.
    #[error("Kubernetes could not {what}: {why}")]
    Api {
        /// What was asked, of which object.
        what: String,
        /// What the API server answered (its status code, reason and
        /// message), or why it could not be asked.
        why: String,
        /// The API server's status code, when it answered.
        code: Option<u16>,
    },
    /// The pod is gone (deleted outside silo, or evicted).
    #[error("Kubernetes has no pod {0} any more (deleted outside silo, or evicted)")]
    Gone(String),
    /// The pod never came up.
    #[error("pod {pod} did not start: {why}")]
    NotStarted {
        /// Its `namespace/name`.
        pod: String,
        /// What its status said last.
        why: String,
    },
    /// A pod deleted to stop its sandbox is still there.
    #[error(
        "pod {pod} was deleted but is still there after {:?}: {why}",
        crate::backend::remote::READY_TIMEOUT
    )]
    NotStopped {
        /// Its `namespace/name`.
        pod: String,
        /// What its status says.
        why: String,
    },
    /// Something a VM provider does that a pod has no way to.
    #[error("a Kubernetes pod cannot {0}")]
    Unsupported(&'static str),
    /// The port-forward to a pod could not be set up.
    #[error("cannot forward a local port to pod {pod}")]
    Forward {
        /// Its `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The system gave no randomness for a pod's name.
    #[error("cannot name a pod: the system gives no randomness")]
    NoRandomness,
    /// A step every remote backend takes failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl KubernetesError {
    /// The error for `what` failing with `source`.
    pub fn api(what: impl Into<String>, source: kube::Error) -> Self {
        let (why, code) = match &source {
            kube::Error::Api(status) => (
                format!("{} {}: {}", status.code, status.reason, status.message),
                Some(status.code),
            ),
            other => (silo_protocol::http::error_chain(other), None),
        };
        KubernetesError::Api {
            what: what.into(),
            why,
            code,
        }
    }
}
