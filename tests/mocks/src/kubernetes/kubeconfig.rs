//! The kubeconfig a mock writes into its scratch directory: one cluster
//! (the API's `https://127.0.0.1:PORT` and the test CA inline as
//! `certificate-authority-data`), one user with the bearer token, one
//! context with namespace `default`, and `current-context` set, so
//! kubectl, the Python client and kube-rs need nothing else.

use std::path::Path;

use base64::Engine as _;

/// The name of the cluster, the user and the context.
pub const CONTEXT: &str = "silo-mock";

/// The kubeconfig's text.
pub fn render(server: &str, ca_pem: &[u8], token: &str, namespace: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    // Every value is quoted: a token or URL must never read as another YAML type.
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {CONTEXT}\n  cluster:\n    server: \"{server}\"\n    certificate-authority-data: \"{ca}\"\n\
         users:\n\
         - name: {CONTEXT}\n  user:\n    token: \"{token}\"\n\
         contexts:\n\
         - name: {CONTEXT}\n  context:\n    cluster: {CONTEXT}\n    user: {CONTEXT}\n    namespace: \"{namespace}\"\n\
         current-context: {CONTEXT}\n\
         preferences: {{}}\n"
    )
}

/// Writes the kubeconfig to `path`, readable by its owner only (it holds the token).
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_names_everything_once() {
        let text = render("https://127.0.0.1:6443", b"PEM", "tok", "default");
        assert!(text.contains("server: \"https://127.0.0.1:6443\""));
        assert!(text.contains("certificate-authority-data: \"UEVN\""));
        assert!(text.contains("token: \"tok\""));
        assert!(text.contains("current-context: silo-mock"));
        assert!(text.contains("namespace: \"default\""));
    }
}
