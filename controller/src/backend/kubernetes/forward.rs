//! [`Forwards`]: a pod's port on a local loopback port, through the API
//! server's port-forward, for a silo outside the cluster.
//!
//! The agent client speaks to an address; a port-forward is a stream the
//! API server opens per request. So each forwarded pod port gets a listener
//! on 127.0.0.1 for as long as this process lives, and each connection to
//! it opens one port-forward stream to the pod and relays both ways (as
//! `kubectl port-forward` does). A listener whose task has ended (its
//! runtime went away) is made again on the next ask.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::error::KubernetesError;
use super::{Cluster, PodName};

/// The local listeners of this process, by pod and port.
#[derive(Debug, Default)]
pub struct Forwards {
    open: Mutex<HashMap<(PodName, u16), Listening>>,
}

/// One local listener: its port, and the task accepting on it.
#[derive(Debug)]
struct Listening {
    port: u16,
    task: JoinHandle<()>,
}

impl Forwards {
    /// The local port where `port` of `pod` is forwarded, listening from
    /// now on (within a tokio runtime).
    pub fn local_port(
        &self,
        cluster: &Arc<Cluster>,
        pod: &PodName,
        port: u16,
    ) -> Result<u16, KubernetesError> {
        let failed = |source| KubernetesError::Forward {
            pod: pod.to_string(),
            source,
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(listening) = open.get(&(pod.clone(), port)) {
            if !listening.task.is_finished() {
                return Ok(listening.port);
            }
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| failed(std::io::Error::other(e.to_string())))?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        let local = listener.local_addr().map_err(failed)?.port();
        let _entered = runtime.enter();
        let listener = TcpListener::from_std(listener).map_err(failed)?;
        let task = runtime.spawn(serve(listener, Arc::clone(cluster), pod.clone(), port));
        open.insert((pod.clone(), port), Listening { port: local, task });
        Ok(local)
    }
}

impl Drop for Forwards {
    fn drop(&mut self) {
        let open = self.open.get_mut().unwrap_or_else(|e| e.into_inner());
        for listening in open.values() {
            listening.task.abort();
        }
    }
}

/// Accepts connections for as long as the process lives.
async fn serve(listener: TcpListener, cluster: Arc<Cluster>, pod: PodName, port: u16) {
    loop {
        let Ok((connection, _)) = listener.accept().await else {
            continue;
        };
        let cluster = Arc::clone(&cluster);
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Err(error) = relay(connection, &cluster, &pod, port).await {
                tracing::debug!(%pod, port, "port-forward: {error}");
            }
        });
    }
}

/// One connection, relayed through one port-forward stream.
async fn relay(
    mut connection: TcpStream,
    cluster: &Cluster,
    pod: &PodName,
    port: u16,
) -> Result<(), KubernetesError> {
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
    let mut forwarder = pods
        .portforward(&pod.name, &[port])
        .await
        .map_err(|e| KubernetesError::api(format!("forward port {port} of pod {pod}"), e))?;
    let Some(mut stream) = forwarder.take_stream(port) else {
        return Err(KubernetesError::Forward {
            pod: pod.to_string(),
            source: std::io::Error::other("the port-forward gave no stream"),
        });
    };
    let relayed = tokio::io::copy_bidirectional(&mut connection, &mut stream).await;
    drop(stream);
    forwarder.abort();
    relayed
        .map(|_| ())
        .map_err(|source| KubernetesError::Forward {
            pod: pod.to_string(),
            source,
        })
}
