//! A pod's volumes on the host, under the mock's scratch directory, bound
//! into its containers: an `emptyDir` is a directory (mode 0777, so any
//! user in the pod may write) shared by every container of the pod, init
//! containers included; a `secret` volume is a directory holding the
//! Secret's keys as files (`items` pick and rename keys, `defaultMode` and
//! an item's `mode` set permissions, 0644 unless given), mounted read-only.
//! The files are written once when the pod starts; later changes of the
//! Secret are not seen (a real kubelet refreshes them).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Secret, SecretVolumeSource, Volume};

use super::model::Key;
use super::store::{Store, secrets};

/// A secret volume's file mode unless `defaultMode` is given (0644).
pub const DEFAULT_SECRET_MODE: i32 = 0o644;

/// Why a pod's volumes cannot be made (yet).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The Secret a volume names is not there (the pod waits for it).
    #[error("secret {0:?} not found")]
    MissingSecret(String),
    /// An item names a key the Secret lacks.
    #[error("couldn't find key {key} in Secret {namespace}/{secret}")]
    MissingKey {
        /// The namespace.
        namespace: String,
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
    /// The host directory or a file could not be written.
    #[error("writing {path} failed")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A volume made on the host.
#[derive(Debug, Clone)]
pub struct HostVolume {
    /// Where it is on the host.
    pub path: PathBuf,
    /// Whether every mount of it is read-only (secret volumes).
    pub read_only: bool,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `path` is relative and stays inside its directory (no `..`).
pub fn contained(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Makes every volume of a pod under `pod_dir`, reading Secrets from `store`.
pub fn prepare(
    store: &Store,
    namespace: &str,
    pod_dir: &Path,
    volumes: &[Volume],
) -> Result<BTreeMap<String, HostVolume>, VolumeError> {
    let mut made = BTreeMap::new();
    for volume in volumes {
        if volume.empty_dir.is_some() {
            let path = pod_dir.join("empty-dir").join(&volume.name);
            std::fs::create_dir_all(&path).map_err(io(&path))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                .map_err(io(&path))?;
            made.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: false,
                },
            );
        } else if let Some(source) = &volume.secret {
            let path = pod_dir.join("secret").join(&volume.name);
            write_secret(store, namespace, source, &path)?;
            made.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: true,
                },
            );
        }
    }
    Ok(made)
}

fn write_secret(
    store: &Store,
    namespace: &str,
    source: &SecretVolumeSource,
    dir: &Path,
) -> Result<(), VolumeError> {
    let name = source.secret_name.clone().unwrap_or_default();
    let optional = source.optional.unwrap_or(false);
    let secret: Option<Secret> = store.get(secrets, &Key::new(namespace, &name));
    let data = match secret {
        Some(secret) => secret.data.unwrap_or_default(),
        None if optional => BTreeMap::new(),
        None => return Err(VolumeError::MissingSecret(name)),
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let default_mode = source.default_mode.unwrap_or(DEFAULT_SECRET_MODE);
    let files: Vec<(String, String, i32)> = match &source.items {
        Some(items) => {
            let mut files = Vec::new();
            for item in items {
                if !data.contains_key(&item.key) {
                    if optional {
                        continue;
                    }
                    return Err(VolumeError::MissingKey {
                        namespace: namespace.to_owned(),
                        secret: name,
                        key: item.key.clone(),
                    });
                }
                files.push((
                    item.key.clone(),
                    item.path.clone(),
                    item.mode.unwrap_or(default_mode),
                ));
            }
            files
        }
        None => data
            .keys()
            .map(|k| (k.clone(), k.clone(), default_mode))
            .collect(),
    };
    for (key, relative, mode) in files {
        // Checked when the pod was made; a path leaving the volume is skipped.
        if !contained(&relative) {
            continue;
        }
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let bytes = data.get(&key).map(|b| b.0.as_slice()).unwrap_or_default();
        std::fs::write(&path, bytes).map_err(io(&path))?;
        let mode = u32::try_from(mode & 0o777).unwrap_or(0o644);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(io(&path))?;
    }
    Ok(())
}

/// The engine's bind mounts (`host:container[:ro]`) for `container`'s
/// volume mounts (`subPath` inside the volume; made when missing).
pub fn binds(
    container: &Container,
    volumes: &BTreeMap<String, HostVolume>,
) -> Result<Vec<String>, VolumeError> {
    let mut binds = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let Some(volume) = volumes.get(&mount.name) else {
            continue;
        };
        let mut host = volume.path.clone();
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            host = host.join(sub);
            if !host.exists() {
                std::fs::create_dir_all(&host).map_err(io(&host))?;
            }
        }
        let read_only = volume.read_only || mount.read_only.unwrap_or(false);
        binds.push(format!(
            "{}:{}{}",
            host.display(),
            mount.mount_path,
            if read_only { ":ro" } else { "" }
        ));
    }
    Ok(binds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, KeyToPath, VolumeMount};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn secrets_become_files_with_their_modes() {
        let store = Store::default();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("token".into(), ByteString(b"s3cret".to_vec())),
                ("other".into(), ByteString(b"x".to_vec())),
            ])),
            ..Default::default()
        };
        store.create(secrets, secret).unwrap();
        let dir = std::env::temp_dir().join(format!("silo-volumes-test-{}", std::process::id()));
        let volumes = [
            Volume {
                name: "creds".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some("creds".into()),
                    items: Some(vec![KeyToPath {
                        key: "token".into(),
                        path: "auth/token".into(),
                        mode: Some(0o400),
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
        ];
        let made = prepare(&store, "ns", &dir, &volumes).unwrap();
        let token = made["creds"].path.join("auth/token");
        assert_eq!(std::fs::read(&token).unwrap(), b"s3cret");
        let mode = std::fs::metadata(&token).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        assert!(!made["creds"].path.join("other").exists());
        let container = Container {
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "creds".into(),
                    mount_path: "/etc/creds".into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "scratch".into(),
                    mount_path: "/work".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let binds = binds(&container, &made).unwrap();
        assert!(binds[0].ends_with(":/etc/creds:ro"), "{binds:?}");
        assert!(binds[1].ends_with(":/work"), "{binds:?}");
        let missing = prepare(&store, "other-ns", &dir, &volumes[..1]).unwrap_err();
        assert!(matches!(missing, VolumeError::MissingSecret(name) if name == "creds"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(contained("a/b"));
        assert!(!contained("../x"));
        assert!(!contained("/abs"));
    }
}
