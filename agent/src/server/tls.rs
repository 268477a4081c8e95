//! TLS for TCP listeners, from PEM files, with rustls on the ring provider.
//!
//! Remote sandboxes are reached through a provider's port proxy; TLS keeps
//! the proxy from reading or altering the exec stream. Request signing already
//! authenticates the client, so no client certificates are asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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
    /// A PEM file is malformed.
    #[error("{} is not valid PEM", .path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: pem::Error,
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

impl TlsError {
    /// A PEM failure of `path`; `missing` names a file without the item sought.
    fn pem(path: &Path, missing: fn(PathBuf) -> Self) -> impl FnOnce(pem::Error) -> Self {
        let path = path.to_path_buf();
        move |err| match err {
            pem::Error::Io(source) => Self::Read { path, source },
            pem::Error::NoItemsFound => missing(path),
            source => Self::Pem { path, source },
        }
    }
}

/// Builds an acceptor that speaks HTTP/1.1 over TLS 1.2 or 1.3.
pub fn acceptor(cert_path: &Path, key_path: &Path) -> Result<TlsAcceptor, TlsError> {
    let no_cert = TlsError::NoCertificate;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(TlsError::pem(cert_path, no_cert))?
        .collect::<Result<_, _>>()
        .map_err(TlsError::pem(cert_path, no_cert))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_path_buf()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key_path).map_err(TlsError::pem(key_path, TlsError::NoKey))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEM section of three zero bytes: a certificate only in shape, which
    /// is all the reading step looks at.
    const SHAPED_CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    fn failure(cert: Option<&str>, key: Option<&str>) -> TlsError {
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        if let Some(text) = cert {
            std::fs::write(&cert_path, text).unwrap();
        }
        if let Some(text) = key {
            std::fs::write(&key_path, text).unwrap();
        }
        match acceptor(&cert_path, &key_path) {
            Ok(_) => panic!("accepted"),
            Err(err) => err,
        }
    }

    #[test]
    fn each_bad_pem_file_is_named_with_what_is_wrong() {
        assert!(matches!(failure(None, None), TlsError::Read { .. }));
        assert!(matches!(
            failure(Some("no pem here\n"), None),
            TlsError::NoCertificate(_)
        ));
        assert!(matches!(
            failure(Some("-----BEGIN CERTIFICATE-----\nAAAA\n"), None),
            TlsError::Pem { .. }
        ));
        assert!(matches!(
            failure(Some(SHAPED_CERT), None),
            TlsError::Read { .. }
        ));
        let no_key = failure(Some(SHAPED_CERT), Some(SHAPED_CERT));
        assert!(matches!(no_key, TlsError::NoKey(_)), "{no_key:?}");
        assert!(no_key.to_string().contains("key.pem"), "{no_key}");
    }
}
