//! TLS for TCP listeners, from PEM files, with rustls on the ring provider.
//!
//! Remote sandboxes are reached through a provider's port proxy; TLS keeps
//! the proxy from reading or altering the exec stream. Request signing already
//! authenticates the client, so no client certificates are asked for.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use tokio_rustls::TlsAcceptor;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read.
    #[error("cannot read {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{} holds no PEM certificate", .0.display())]
    NoCertificate(PathBuf),
    /// The key file holds no private key.
    #[error("{} holds no PEM private key", .0.display())]
    NoKey(PathBuf),
    /// rustls refused the certificate or key.
    #[error("unusable certificate or key")]
    Rustls(#[source] rustls::Error),
}

/// Builds an acceptor that speaks HTTP/1.1 over TLS 1.2 or 1.3.
pub fn acceptor(cert_path: &Path, key_path: &Path) -> Result<TlsAcceptor, TlsError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Read { path, source }
    };
    let mut certs_pem = BufReader::new(File::open(cert_path).map_err(read_err(cert_path))?);
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut certs_pem)
        .collect::<Result<_, _>>()
        .map_err(read_err(cert_path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_path_buf()));
    }
    let mut key_pem = BufReader::new(File::open(key_path).map_err(read_err(key_path))?);
    let key = rustls_pemfile::private_key(&mut key_pem)
        .map_err(read_err(key_path))?
        .ok_or_else(|| TlsError::NoKey(key_path.to_path_buf()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Rustls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
