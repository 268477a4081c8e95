//! Files in a sandbox's container, through the engine's archive endpoints:
//! a stat (`HEAD …/archive`), a one-file tar upload into `/` (the engine
//! makes missing parent directories), a write that keeps an existing file's
//! mode as `open(2)` would, and a download that reads the one entry of the
//! engine's tar. Paths are cleaned lexically ([`clean_path`]) by callers
//! before they get here.

use std::io::Read;

use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use futures_util::TryStreamExt;

use super::{Container, ContainerError, engine};

/// Go's `os.ModeDir`, the directory bit of the engine's `mode`.
const GO_MODE_DIR: u32 = 1 << 31;
/// Go's `os.ModeSymlink`.
const GO_MODE_SYMLINK: u32 = 1 << 27;
/// Most symlinks followed when reading one file.
const MAX_LINK_HOPS: usize = 8;

/// What is at a path in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathKind {
    /// Nothing.
    Missing,
    /// A directory.
    Directory,
    /// A symlink to `target`.
    Symlink {
        /// The link's text.
        target: String,
    },
    /// Anything else, with its permission bits.
    File {
        /// Permission bits (`0o7777` part of the mode).
        mode: u32,
    },
}

/// What [`Container::write_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file was written.
    File,
    /// Nothing: the path is a directory.
    IsDirectory,
}

/// The owner and permissions of an uploaded file.
#[derive(Debug, Clone, Copy)]
pub struct Ownership {
    /// Owner uid.
    pub uid: u64,
    /// Owner gid.
    pub gid: u64,
    /// Permission bits (for [`Container::write_file`]: of a new file).
    pub mode: u32,
}

impl Container {
    /// What is at `path` (absolute), without following a final symlink.
    pub async fn stat(&self, path: &str) -> Result<PathKind, ContainerError> {
        let options = ContainerArchiveInfoOptionsBuilder::new().path(path).build();
        match self
            .docker
            .get_container_archive_info(&self.id, Some(options))
            .await
        {
            Ok(stat) if stat.file_mode & GO_MODE_DIR != 0 => Ok(PathKind::Directory),
            Ok(stat) if stat.file_mode & GO_MODE_SYMLINK != 0 => Ok(PathKind::Symlink {
                target: stat.link_target,
            }),
            Ok(stat) => Ok(PathKind::File {
                mode: stat.file_mode & 0o7777,
            }),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(PathKind::Missing),
            Err(error) => Err(engine(format!("stat {path} in {}", self.id))(error)),
        }
    }

    /// Writes `data` to `path` (absolute), replacing a file there and
    /// making missing parent directories.
    pub async fn upload(
        &self,
        path: &str,
        data: &[u8],
        owner: Ownership,
    ) -> Result<(), ContainerError> {
        let archive_error = |source| ContainerError::Archive {
            path: path.to_owned(),
            source,
        };
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(owner.mode);
        header.set_uid(owner.uid);
        header.set_gid(owner.gid);
        header.set_mtime(now_unix());
        header.set_entry_type(tar::EntryType::Regular);
        let mut archive = tar::Builder::new(Vec::new());
        archive
            .append_data(&mut header, path.trim_start_matches('/'), data)
            .map_err(archive_error)?;
        let body = archive.into_inner().map_err(archive_error)?;
        let options = UploadToContainerOptionsBuilder::new().path("/").build();
        self.docker
            .upload_to_container(&self.id, Some(options), bollard::body_full(body.into()))
            .await
            .map_err(engine(format!("upload {path} into {}", self.id)))
    }

    /// Writes `data` to `path` (absolute) as `open(2)` with `O_CREAT` and
    /// `O_TRUNC` would: a final symlink is followed, an existing file keeps
    /// its mode, a new one gets `new_mode`; missing parents are made.
    pub async fn write_file(
        &self,
        path: &str,
        data: &[u8],
        owner: Ownership,
    ) -> Result<Written, ContainerError> {
        let mut target = path.to_owned();
        let mode = loop {
            match self.stat(&target).await? {
                PathKind::Missing => break owner.mode,
                PathKind::File { mode } => break mode,
                PathKind::Directory => return Ok(Written::IsDirectory),
                PathKind::Symlink { target: link } if target == path => {
                    target = resolve_link(path, &link);
                }
                PathKind::Symlink { .. } => break owner.mode,
            }
        };
        self.upload(&target, data, Ownership { mode, ..owner })
            .await?;
        Ok(Written::File)
    }

    /// The bytes of the file at `path` (absolute), following symlinks;
    /// `None` if nothing is there.
    pub async fn download(&self, path: &str) -> Result<Option<Vec<u8>>, ContainerError> {
        let mut path = path.to_owned();
        for _ in 0..MAX_LINK_HOPS {
            let options = DownloadFromContainerOptionsBuilder::new()
                .path(&path)
                .build();
            let chunks: Result<Vec<bytes::Bytes>, _> = self
                .docker
                .download_from_container(&self.id, Some(options))
                .try_collect()
                .await;
            let tar = match chunks {
                Ok(chunks) => chunks.concat(),
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(None),
                Err(error) => {
                    return Err(engine(format!("download {path} from {}", self.id))(error));
                }
            };
            match first_entry(&tar).map_err(|source| ContainerError::Archive {
                path: path.clone(),
                source,
            })? {
                Entry::File(bytes) => return Ok(Some(bytes)),
                Entry::Link(target) => path = resolve_link(&path, &target),
            }
        }
        Ok(None)
    }
}

/// An absolute path with `.`, `..` and repeated slashes removed lexically
/// (what Go's `filepath.Clean` gives for an absolute path).
pub fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

enum Entry {
    File(Vec<u8>),
    Link(String),
}

/// The first entry of a tar: its bytes, or its link target.
fn first_entry(tar: &[u8]) -> Result<Entry, std::io::Error> {
    let mut archive = tar::Archive::new(tar);
    let mut entries = archive.entries()?;
    let Some(entry) = entries.next() else {
        return Err(std::io::Error::other("the engine sent an empty archive"));
    };
    let mut entry = entry?;
    if entry.header().entry_type().is_symlink() {
        let target = entry
            .link_name()?
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(Entry::Link(target));
    }
    let mut bytes = Vec::new();
    entry.read_to_end(&mut bytes)?;
    Ok(Entry::File(bytes))
}

/// The path a link at `link` with text `target` points to.
fn resolve_link(link: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_owned();
    }
    let parent = link.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
    format!("{parent}/{target}")
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_clean_lexically() {
        assert_eq!(clean_path("/tmp//z/."), "/tmp/z");
        assert_eq!(clean_path("/a/b/../c"), "/a/c");
        assert_eq!(clean_path("/../.."), "/");
    }

    #[test]
    fn links_resolve_against_their_directory() {
        assert_eq!(resolve_link("/a/b/link", "c"), "/a/b/c");
        assert_eq!(resolve_link("/a/link", "/etc/x"), "/etc/x");
        assert_eq!(resolve_link("/link", "../x"), "/../x");
    }
}
