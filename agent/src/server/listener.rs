//! Binding the listening socket and accepting connections on it.
//!
//! A Unix socket is the local path (for Docker it sits in a host directory
//! bind-mounted into the container, which works even with networking off);
//! TCP, usually with TLS, is the remote one. A stale socket file from an
//! earlier run is replaced, but a live agent's socket is never stolen.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_rustls::TlsAcceptor;

use crate::config::ListenAddr;

/// Mode of the Unix socket. Anyone who can reach the directory may connect:
/// the controller on the host may run as a different user than the agent in
/// the container, and every request but `/healthz` is signed anyway. The
/// directory's permissions decide who can reach it.
const SOCKET_MODE: u32 = 0o666;

/// Why the listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another agent answers on the socket path.
    #[error("{} is in use by a live listener", .0.display())]
    InUse(PathBuf),
    /// Something that is not a socket sits at the path.
    #[error("{} exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// Binding or preparing failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A bound listener.
pub enum Listener {
    /// On a Unix socket, removed again at close.
    Unix {
        /// The socket.
        inner: UnixListener,
        /// Its path.
        path: PathBuf,
    },
    /// On TCP, with TLS when an acceptor is set.
    Tcp {
        /// The socket.
        inner: TcpListener,
        /// TLS, when configured.
        tls: Option<TlsAcceptor>,
    },
}

/// A connection, before any TLS handshake.
pub enum Accepted {
    /// Over the Unix socket.
    Unix(UnixStream),
    /// Over TCP, in the clear.
    Tcp(TcpStream),
    /// Over TCP, TLS handshake still to do.
    Tls(TcpStream, TlsAcceptor),
}

impl Listener {
    /// Binds `addr`; for TCP, `tls` turns on TLS.
    pub async fn bind(addr: &ListenAddr, tls: Option<TlsAcceptor>) -> Result<Self, ListenError> {
        let bind_err = |source| ListenError::Bind {
            addr: addr.to_string(),
            source,
        };
        match addr {
            ListenAddr::Unix(path) => {
                prepare_socket_path(path)?;
                let inner = UnixListener::bind(path).map_err(bind_err)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
                    .map_err(bind_err)?;
                Ok(Self::Unix {
                    inner,
                    path: path.clone(),
                })
            }
            ListenAddr::Tcp(host_port) => {
                let inner = TcpListener::bind(host_port.as_str())
                    .await
                    .map_err(bind_err)?;
                Ok(Self::Tcp { inner, tls })
            }
        }
    }

    /// Where it actually listens (the real port when 0 was asked for).
    pub fn describe(&self) -> String {
        match self {
            Self::Unix { path, .. } => format!("unix:{}", path.display()),
            Self::Tcp { inner, tls } => {
                let scheme = if tls.is_some() { "tcp+tls" } else { "tcp" };
                match inner.local_addr() {
                    Ok(addr) => format!("{scheme}:{addr}"),
                    Err(_) => scheme.to_owned(),
                }
            }
        }
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Self::Unix { inner, .. } => Ok(Accepted::Unix(inner.accept().await?.0)),
            Self::Tcp { inner, tls } => {
                let (stream, _) = inner.accept().await?;
                // Exec frames are small and latency-bound.
                stream.set_nodelay(true)?;
                Ok(match tls {
                    Some(tls) => Accepted::Tls(stream, tls.clone()),
                    None => Accepted::Tcp(stream),
                })
            }
        }
    }

    /// Stops listening; a Unix socket's file is removed.
    pub fn close(self) {
        if let Self::Unix { inner, path } = self {
            drop(inner);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Creates the parent directory and clears a stale socket from an earlier run.
fn prepare_socket_path(path: &Path) -> Result<(), ListenError> {
    let bind_err = |source| ListenError::Bind {
        addr: format!("unix:{}", path.display()),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(bind_err)
        }
        Ok(_) => Err(ListenError::NotASocket(path.to_path_buf())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(bind_err(err)),
    }
}
