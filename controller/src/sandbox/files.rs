//! Files in one sandbox, through the agent's file API (see
//! [`silo_protocol::files`] for the endpoints and which paths are allowed).
//!
//! Writes are atomic on the agent's side (a temp file renamed into place,
//! after the body matched its signed SHA-256), so a reader in the sandbox
//! sees the old file or the new one, never half of either.
//!
//! Copies between the host and the sandbox with `docker cp`'s rules are
//! [`Files::copy_in`] and [`Files::copy_out`] (`copy`), over the host's half
//! of a tree (`host`: a tar with its modes, and an unpack beside the
//! destination).

use bytes::Bytes;
use http::{Method, StatusCode};
use silo_protocol::ErrorKind;
use silo_protocol::auth::body_sha256;
use silo_protocol::files::{
    FileQuery, FileStat, Listing, PATH_FILE, PATH_LIST, PATH_MKDIR, PATH_RENAME, PATH_STAT,
    PATH_TREE, Removed, TreeWritten,
};
use silo_protocol::http::ErrorBody;

use http_body_util::BodyExt;

use crate::client::{AgentClient, ClientError, DirWatch, Response, transport};

mod copy;
mod host;

pub use copy::{Copied, CopyError};

/// The files of one sandbox.
#[derive(Debug, Clone)]
pub struct Files {
    client: AgentClient,
    confine: Option<String>,
}

impl Files {
    /// Files through `client` (a sandbox's, or any agent's).
    pub fn new(client: AgentClient) -> Self {
        Self {
            client,
            confine: None,
        }
    }

    /// The same files, every request kept beneath `dir` through no symlink
    /// (for paths that sandbox code could have planted links in).
    pub fn confined_to(mut self, dir: impl Into<String>) -> Self {
        self.confine = Some(dir.into());
        self
    }

    /// A regular file's contents.
    pub async fn read(&self, path: &str) -> Result<Bytes, FileError> {
        let answer = self.call(Method::GET, PATH_FILE, self.query(path), Bytes::new());
        Ok(answer.await?.body)
    }

    /// A regular file's contents as they arrive, for a file too large to
    /// hold at once. What the agent refuses (a missing file, a directory)
    /// is refused here, before the first chunk.
    pub async fn read_stream(&self, path: &str) -> Result<FileStream, FileError> {
        let query = self.query(path);
        let response = self
            .client
            .get_for_stream(&query.path_and_query(PATH_FILE))
            .await?;
        let status = response.status();
        if status.is_success() {
            return Ok(FileStream {
                body: response.into_body(),
            });
        }
        let body = transport::whole(response.into_body()).await?;
        let ErrorBody { kind, message } = Response { status, body }.error_body();
        Err(FileError::Refused {
            path: query.path,
            status,
            kind,
            message,
        })
    }

    /// Writes `data` to `path` atomically, with `mode` (0644 for a new file,
    /// or the old file's mode, when `None`), making missing parents.
    pub async fn write(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        mode: Option<u32>,
    ) -> Result<FileStat, FileError> {
        let mut query = self.query(path);
        query.mode = mode;
        query.parents = true;
        let answer = self
            .call(Method::PUT, PATH_FILE, query, data.into())
            .await?;
        decode(&answer)
    }

    /// What is at `path` (a final symlink is described, not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat, FileError> {
        let answer = self.call(Method::GET, PATH_STAT, self.query(path), Bytes::new());
        decode(&answer.await?)
    }

    /// Whether anything is at `path`.
    pub async fn exists(&self, path: &str) -> Result<bool, FileError> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(FileError::Refused {
                kind: ErrorKind::NotFound,
                ..
            }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// A directory's entries, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<FileStat>, FileError> {
        let answer = self.call(Method::GET, PATH_LIST, self.query(path), Bytes::new());
        Ok(decode::<Listing>(&answer.await?)?.entries)
    }

    /// What `ls` shows for `path`: a directory's entries, sorted by name,
    /// or the path itself when it is anything else.
    pub async fn entries(&self, path: &str) -> Result<Vec<FileStat>, FileError> {
        match self.list(path).await {
            Err(FileError::Refused {
                kind: ErrorKind::NotADirectory,
                ..
            }) => Ok(vec![self.stat(path).await?]),
            listed => listed,
        }
    }

    /// Makes a directory and any missing parents.
    pub async fn mkdir(&self, path: &str, mode: Option<u32>) -> Result<FileStat, FileError> {
        let mut query = self.query(path);
        query.mode = mode;
        query.parents = true;
        decode(
            &self
                .call(Method::POST, PATH_MKDIR, query, Bytes::new())
                .await?,
        )
    }

    /// Removes a file, a symlink or a directory; a non-empty directory only
    /// with `recursive`. Answers how many paths went.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<u64, FileError> {
        let mut query = self.query(path);
        query.recursive = recursive;
        let answer = self.call(Method::DELETE, PATH_FILE, query, Bytes::new());
        Ok(decode::<Removed>(&answer.await?)?.entries)
    }

    /// Moves `from` to `to` in one step (atomic, on one file system),
    /// making missing parents of `to`. A file at `to` is replaced, a
    /// directory only when empty. Answers what is at `to` now.
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileStat, FileError> {
        let mut query = self.query(from);
        query.to = Some(to.to_owned());
        query.parents = true;
        decode(
            &self
                .call(Method::POST, PATH_RENAME, query, Bytes::new())
                .await?,
        )
    }

    /// Watches the directory `path` (its subdirectories too with
    /// `recursive`) on a connection of its own: changes stream until the
    /// watch is stopped or dropped, or its directory goes away.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<DirWatch, FileError> {
        let connection = self.client.connect().await?;
        match connection.watch(path, recursive).await {
            Ok(watch) => Ok(watch),
            // Refused on the exec channel: the status the same refusal
            // has on the file API.
            Err(ClientError::Agent { kind, message }) => Err(FileError::Refused {
                path: path.to_owned(),
                status: kind
                    .status()
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .unwrap_or(StatusCode::BAD_REQUEST),
                kind,
                message,
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// A file or a tree as an uncompressed tar, entries named from the
    /// path's last component.
    pub async fn download(&self, path: &str) -> Result<Bytes, FileError> {
        let answer = self.call(Method::GET, PATH_TREE, self.query(path), Bytes::new());
        Ok(answer.await?.body)
    }

    /// Unpacks a tar into the directory `dir` (made if missing), merging
    /// with what is there; the push extract's entry rules apply.
    pub async fn upload(&self, dir: &str, tar: impl Into<Bytes>) -> Result<TreeWritten, FileError> {
        let mut query = self.query(dir);
        query.parents = true;
        decode(&self.call(Method::PUT, PATH_TREE, query, tar.into()).await?)
    }

    fn query(&self, path: &str) -> FileQuery {
        FileQuery {
            confine: self.confine.clone(),
            ..FileQuery::new(path)
        }
    }

    async fn call(
        &self,
        method: Method,
        endpoint: &str,
        query: FileQuery,
        body: Bytes,
    ) -> Result<Response, FileError> {
        let target = query.path_and_query(endpoint);
        let sha256 = body_sha256(&body);
        let answer = self
            .client
            .request_streamed(method, &target, body, &sha256, None)
            .await?;
        if answer.status.is_success() {
            return Ok(answer);
        }
        let ErrorBody { kind, message } = answer.error_body();
        Err(FileError::Refused {
            path: query.path,
            status: answer.status,
            kind,
            message,
        })
    }
}

/// A file's bytes as the agent sends them ([`Files::read_stream`]).
#[derive(Debug)]
pub struct FileStream {
    body: hyper::body::Incoming,
}

impl FileStream {
    /// The next chunk; `None` at the end of the file.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, FileError> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(ClientError::http)?;
            if let Ok(data) = frame.into_data()
                && !data.is_empty()
            {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

fn decode<T: serde::de::DeserializeOwned>(answer: &Response) -> Result<T, FileError> {
    serde_json::from_slice(&answer.body)
        .map_err(|e| ClientError::Protocol(format!("unreadable file API answer: {e}")).into())
}

/// Why a file request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The agent refused it.
    #[error("{}", refusal(path, message))]
    Refused {
        /// The path the request named.
        path: String,
        /// The HTTP status.
        status: StatusCode,
        /// The stable category.
        kind: ErrorKind,
        /// The agent's explanation.
        message: String,
    },
    /// The agent could not be reached or spoke nonsense.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The agent's message, led by the path unless it names it already (as
/// itself, or as the absolute path a relative one became).
fn refusal(path: &str, message: &str) -> String {
    let bare = path.trim_end_matches('/');
    let names_it = !bare.is_empty()
        && message.match_indices(bare).any(|(at, _)| {
            let before = message[..at].chars().next_back();
            let after = message[at + bare.len()..].chars().next();
            matches!(before, None | Some('/' | ' ' | '"'))
                && matches!(after, None | Some(' ' | ':' | ',' | '"' | '/'))
        });
    if names_it {
        message.to_owned()
    } else {
        format!("{path}: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn a_refusal_names_the_path_once() {
        assert_eq!(
            refusal("notes.txt", "/work/notes.txt does not exist"),
            "/work/notes.txt does not exist"
        );
        assert_eq!(
            refusal("/a/b", "/a/b is a directory"),
            "/a/b is a directory"
        );
        assert_eq!(
            refusal("a", "body is larger than the limit of 5 bytes"),
            "a: body is larger than the limit of 5 bytes"
        );
        assert_eq!(
            refusal("b", "/a/bb is a directory"),
            "b: /a/bb is a directory"
        );
    }
}
