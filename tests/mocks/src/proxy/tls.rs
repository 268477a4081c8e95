//! The test certificate authority: a CA made at start, its PEM written to a
//! file clients can trust, and a server certificate for `*.{domain}` (plus
//! `{domain}`, `localhost` and `127.0.0.1`) signed by it. Nothing here is
//! kept beyond the process: every start makes a new CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the test CA could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen refused the parameters (e.g. a domain that is no DNS name).
    #[error("making the test certificates for {domain:?} failed")]
    Certificate {
        /// The domain asked for.
        domain: String,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },
    /// rustls refused the certificate or the key.
    #[error("building the tls server configuration failed")]
    Server(#[source] rustls::Error),
    /// The CA file could not be written.
    #[error("writing the ca certificate to {path} failed")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A fresh CA and the server configuration its certificate serves.
pub struct TestCa {
    pem_path: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    /// Makes a CA and a wildcard certificate for `domain`, and writes the
    /// CA's PEM to `pem_path`.
    pub fn generate(domain: &str, pem_path: &Path) -> Result<Self, TlsError> {
        let certificate = |source| TlsError::Certificate {
            domain: domain.to_owned(),
            source,
        };
        let ca_key = KeyPair::generate().map_err(certificate)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(certificate)?;
        ca_params.distinguished_name = name("silo mock test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(certificate)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let names = vec![
            format!("*.{domain}"),
            domain.to_owned(),
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        let leaf_key = KeyPair::generate().map_err(certificate)?;
        let mut leaf_params = CertificateParams::new(names).map_err(certificate)?;
        leaf_params.distinguished_name = name(&format!("*.{domain}"));
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let leaf_cert = leaf_params
            .signed_by(&leaf_key, &issuer)
            .map_err(certificate)?;

        std::fs::write(pem_path, ca_cert.pem()).map_err(|source| TlsError::Write {
            path: pem_path.to_path_buf(),
            source,
        })?;

        let chain: Vec<CertificateDer<'static>> =
            vec![leaf_cert.der().clone(), ca_cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Server)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(TlsError::Server)?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            pem_path: pem_path.to_path_buf(),
            server: Arc::new(server),
        })
    }

    /// The file holding the CA certificate (PEM).
    pub fn pem_path(&self) -> &Path {
        &self.pem_path
    }

    /// The server side of TLS with the wildcard certificate.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}
