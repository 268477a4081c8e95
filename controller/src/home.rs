//! `$SILO_HOME`: the one directory that holds everything silo keeps on the host.
//!
//! Every path the controller writes is derived here, so the layout is written
//! down once: `state.db` (SQLite), `master.key`, `home-id` (this home's
//! identity, which labels its containers), `bin/` (the extracted agent),
//! `engine-api-<engine>` (the API version an engine agreed to, and the
//! socket it answered on) and `sandboxes/<id>/` (per-sandbox directories:
//! the local backend's scratch space, the Docker backend's agent socket
//! directory).

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Random bytes in a home identity (shown as twice as many hex digits).
const HOME_ID_BYTES: usize = 8;

/// Environment variable that overrides the default home.
pub const HOME_ENV: &str = "SILO_HOME";

/// The root of silo's host-side state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `explicit`, else `$SILO_HOME`, else `~/.local/share/silo`.
    pub fn resolve(explicit: Option<PathBuf>) -> Result<Self, HomeError> {
        if let Some(root) = explicit {
            return Ok(Self::at(root));
        }
        if let Some(root) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            return Ok(Self::at(PathBuf::from(root)));
        }
        let user_home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .ok_or(HomeError::NoHome)?;
        Ok(Self::at(PathBuf::from(user_home).join(".local/share/silo")))
    }

    /// A home rooted exactly at `root` (made absolute against the current directory).
    pub fn at(root: PathBuf) -> Self {
        // Paths end up in agent command lines and socket addresses, which a
        // process with another working directory must be able to follow.
        let root = std::path::absolute(&root).unwrap_or(root);
        Self { root }
    }

    /// Creates the home directory (owner-only) if it does not exist yet.
    pub fn ensure(&self) -> Result<(), HomeError> {
        create_private_dir(&self.root).map_err(|source| HomeError::Create {
            path: self.root.clone(),
            source,
        })
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database.
    pub fn state_db(&self) -> PathBuf {
        self.root.join("state.db")
    }

    /// The master key from which every sandbox key is derived.
    pub fn master_key(&self) -> PathBuf {
        self.root.join("master.key")
    }

    /// This home's random identity, drawn on first use.
    pub fn identity(&self) -> PathBuf {
        self.root.join("home-id")
    }

    /// The API version the engine `engine` ("docker", "podman") agreed to,
    /// remembered for the next process.
    pub fn engine_api_version(&self, engine: &str) -> PathBuf {
        self.root.join(format!("engine-api-{engine}"))
    }

    /// Where the embedded agent is extracted.
    pub fn bin_dir(&self) -> PathBuf {
        self.root.join("bin")
    }

    /// The content-addressed store of snapshot layers.
    pub fn store_dir(&self) -> PathBuf {
        self.root.join("store")
    }

    /// The scratch directory of one sandbox (host-side backends only).
    pub fn sandbox_dir(&self, sandbox_id: &str) -> PathBuf {
        self.root.join("sandboxes").join(sandbox_id)
    }
}

/// Creates `path` and its missing parents with mode 0700.
pub(crate) fn create_private_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Why the home directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// Neither `$SILO_HOME` nor `$HOME` is set.
    #[error("cannot tell where to keep state: set SILO_HOME or HOME")]
    NoHome,
    /// The directory could not be created.
    #[error("cannot create silo home {}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A home's identity as a backend labels its machines with it: read (or
/// drawn) on first use, then kept for the process's life.
#[derive(Debug)]
pub struct HomeId {
    path: PathBuf,
    id: std::sync::OnceLock<String>,
}

impl HomeId {
    /// The identity of `home`, not read yet.
    pub fn of(home: &Home) -> Self {
        Self {
            path: home.identity(),
            id: std::sync::OnceLock::new(),
        }
    }

    /// The identity, read or drawn the first time.
    pub fn get(&self) -> io::Result<String> {
        if let Some(id) = self.id.get() {
            return Ok(id.clone());
        }
        let id = load_or_create_home_id(&self.path)?;
        Ok(self.id.get_or_init(|| id).clone())
    }

    /// Its file, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The home's identity, drawn and stored on first use. Two processes racing
/// to draw it agree: the file is linked into place only if absent, and
/// whoever loses reads the winner's.
pub fn load_or_create_home_id(path: &Path) -> io::Result<String> {
    if let Some(id) = read_home_id(path)? {
        return Ok(id);
    }
    let mut bytes = [0u8; HOME_ID_BYTES];
    getrandom::fill(&mut bytes).map_err(|_| io::Error::other("no randomness for a home id"))?;
    crate::fsutil::create_atomic(path, format!("{}\n", hex::encode(bytes)).as_bytes(), 0o600)?;
    read_home_id(path)?.ok_or_else(|| io::Error::other("home id file is empty"))
}

fn read_home_id(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|id| !id.is_empty())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_home_wins_and_layout_is_fixed() {
        let home = Home::resolve(Some("/srv/silo".into())).unwrap();
        assert_eq!(home.state_db(), Path::new("/srv/silo/state.db"));
        assert_eq!(home.master_key(), Path::new("/srv/silo/master.key"));
        assert_eq!(
            home.sandbox_dir("sbx-0123456789ab"),
            Path::new("/srv/silo/sandboxes/sbx-0123456789ab")
        );
    }

    #[test]
    fn relative_homes_become_absolute() {
        assert!(Home::at("rel".into()).root().is_absolute());
    }

    #[test]
    fn home_ids_are_drawn_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("home-id");
        let first = load_or_create_home_id(&path).unwrap();
        assert_eq!(first.len(), HOME_ID_BYTES * 2);
        assert_eq!(load_or_create_home_id(&path).unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            load_or_create_home_id(&other.path().join("home-id")).unwrap(),
            first
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp files left"
        );
    }
}
