//! A Unix-socket relay in front of an agent that a test can cut: every
//! connection through it is dropped at once, as a network would drop it,
//! while new connections go through as before.

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// The relay; it stops when dropped.
pub struct CuttingProxy {
    path: PathBuf,
    cuts: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl CuttingProxy {
    /// Relays `path` to the agent socket `upstream`.
    pub fn start(path: &Path, upstream: &Path) -> Self {
        let listener = UnixListener::bind(path).expect("binding the relay socket");
        let (cuts, _) = watch::channel(0u64);
        let watcher = cuts.clone();
        let upstream = upstream.to_path_buf();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = watcher.subscribe();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut agent) = UnixStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut agent) => {}
                        _ = cut.changed() => {}
                    }
                    // Both sockets drop here: each side sees the connection end.
                });
            }
        });
        Self {
            path: path.to_path_buf(),
            cuts,
            accept,
        }
    }

    /// The socket to connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drops every connection open through the relay now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
