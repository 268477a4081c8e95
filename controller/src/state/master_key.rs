//! The master key: 32 random bytes in `$SILO_HOME/master.key`, in hex.
//!
//! Every sandbox key derives from it, so it is created owner-only, and a file
//! that others can read is refused rather than used: a key that may have leaked
//! protects nothing, and silently tightening the mode would hide that it did.
//! Creation is atomic across processes: the key is written to a private temp
//! file and hard-linked into place, which fails if another process got there
//! first, and then the winner's key is read.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use silo_protocol::auth::{AuthError, Key};

/// Reads the master key at `path`, creating it if absent.
pub fn load_or_create_master_key(path: &Path) -> Result<Key, MasterKeyError> {
    match read_key(path) {
        Err(MasterKeyError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            create_key(path)?;
            read_key(path)
        }
        other => other,
    }
}

fn read_key(path: &Path) -> Result<Key, MasterKeyError> {
    let read_err = |source| MasterKeyError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(MasterKeyError::NotAFile(path.to_owned()));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(MasterKeyError::Exposed {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = String::new();
    io::Read::read_to_string(&mut file, &mut text).map_err(read_err)?;
    Key::from_hex(&text).map_err(|source| MasterKeyError::Malformed {
        path: path.to_owned(),
        source,
    })
}

fn create_key(path: &Path) -> Result<(), MasterKeyError> {
    let write_err = |source| MasterKeyError::Write {
        path: path.to_owned(),
        source,
    };
    let key = Key::generate().map_err(|source| MasterKeyError::Malformed {
        path: path.to_owned(),
        source,
    })?;
    // Never replaces an existing key: of two racing creators exactly one key
    // wins and both go on to read it.
    crate::fsutil::create_atomic(path, format!("{}\n", key.to_hex()).as_bytes(), 0o600)
        .map_err(write_err)
}

/// Why the master key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MasterKeyError {
    /// The fleet's key in the shared state could not be made or read.
    #[error("the fleet's master key in the shared state is unusable")]
    Shared {
        /// Why.
        #[source]
        source: AuthError,
    },
    /// The file exists but is readable by group or others.
    #[error(
        "master key {} is readable by group or others (mode {mode:o}); \
         it may have leaked: replace it (removing it makes a new one, and \
         existing sandboxes must then be recreated) or run `chmod 600` on it",
        path.display()
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Something other than a regular file is in the way.
    #[error("master key {} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// The file could not be read.
    #[error("cannot read master key {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file could not be created.
    #[error("cannot create master key {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file does not hold a key, or no key could be generated.
    #[error("master key {} is unusable", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: AuthError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    #[test]
    fn created_once_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        let key = load_or_create_master_key(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(load_or_create_master_key(&path).unwrap(), key);
        // Only the key file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        load_or_create_master_key(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = load_or_create_master_key(&path).unwrap_err();
        assert!(
            matches!(err, MasterKeyError::Exposed { mode: 0o640, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap()
            .write_all(b"not hex")
            .unwrap();
        assert!(matches!(
            load_or_create_master_key(&path),
            Err(MasterKeyError::Malformed { .. })
        ));
    }

    #[test]
    fn racing_creators_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        let keys: Vec<Key> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create_master_key(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }
}
