//! `filesystem.Filesystem` as envd serves it (e2b-dev/infra
//! `packages/envd/spec/filesystem/filesystem.proto`): `Stat`, `ListDir`,
//! `MakeDir` and `Remove` (unary), which the SDK's `files.exists`,
//! `files.list`, `files.get_info`, `files.make_dir` and `files.remove` call.
//!
//! Entries ([`crate::containers::entries`]) are written as envd's
//! `EntryInfo` in protojson: `size` as a string and left out at 0, `mode`
//! as Go's `FileMode` (type bits on top of the permission bits),
//! `permissions` as Go prints a mode, owners by the name envd's users have
//! (a number otherwise), `modifiedTime` to the second. Not modelled:
//! `Move`, the watchers (`unimplemented`), file metadata (extended
//! attributes).

use http::{Request, Response};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use silo_protocol::http::error_chain;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::connect::{Code, RpcError, unary_error, unary_ok, unary_request};
use super::{USERS, User, resolve_path, user_from_headers};
use crate::containers::ContainerError;
use crate::containers::entries::{Entry, go_mode, go_mode_string};
use crate::e2b::store::Record;
use crate::http::Body;

#[derive(Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

/// The user and the message of a unary call, or the answer refusing it.
async fn read<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<(&'static User, T), Response<Body>> {
    let user = user_from_headers(request.headers()).map_err(unary_error)?;
    let message = unary_request(request).await?;
    Ok((user, message))
}

/// `filesystem.Filesystem/Stat`.
pub async fn stat(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let (user, message) = match read::<PathRequest>(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let path = resolve_path(&message.path, user);
    answer_entry(record, &path).await
}

/// `filesystem.Filesystem/ListDir`: entries under the path down to
/// `depth` levels (0 reads as 1), with their paths as asked.
pub async fn list_dir(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let (user, message) = match read::<ListDirRequest>(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let path = resolve_path(&message.path, user);
    match record.container.entry(&path, true).await {
        Ok(None) => {
            return unary_error(RpcError::new(
                Code::NotFound,
                format!("path not found: lstat {path}: no such file or directory"),
            ));
        }
        Ok(Some(entry)) if !entry.is_dir() => {
            return unary_error(RpcError::new(
                Code::InvalidArgument,
                format!("path is not a directory: {path}"),
            ));
        }
        Ok(Some(_)) => {}
        Err(error) => return unary_error(internal(&error)),
    }
    let entries = match record.container.walk(&path, message.depth).await {
        Ok(entries) => entries,
        Err(error) => return unary_error(internal(&error)),
    };
    let mut listed = Vec::with_capacity(entries.len());
    for entry in entries {
        listed.push(entry_json(record, entry).await);
    }
    unary_ok(&json!({ "entries": listed }))
}

/// `filesystem.Filesystem/MakeDir`: parents too, owned by the user.
pub async fn make_dir(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let (user, message) = match read::<PathRequest>(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let path = resolve_path(&message.path, user);
    match record.container.entry(&path, true).await {
        Ok(Some(entry)) if entry.is_dir() => {
            return unary_error(RpcError::new(
                Code::AlreadyExists,
                format!("directory already exists: {path}"),
            ));
        }
        Ok(Some(_)) => {
            return unary_error(RpcError::new(
                Code::InvalidArgument,
                format!("path already exists but it is not a directory: {path}"),
            ));
        }
        Ok(None) => {}
        Err(error) => return unary_error(internal(&error)),
    }
    let owner = format!("{}:{}", user.uid, user.gid);
    let script = "mkdir -p \"$1\" && chown \"$2\" \"$1\"";
    match record
        .container
        .run(&["sh", "-c", script, "sh", &path, &owner])
        .await
    {
        Ok(finished) if finished.code == 0 => answer_entry(record, &path).await,
        Ok(finished) => unary_error(RpcError::new(
            Code::Internal,
            format!(
                "error making directory: {}",
                String::from_utf8_lossy(&finished.stderr).trim()
            ),
        )),
        Err(error) => unary_error(internal(&error)),
    }
}

/// `filesystem.Filesystem/Remove`: a file, a link or a whole directory.
pub async fn remove(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let (user, message) = match read::<PathRequest>(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let path = resolve_path(&message.path, user);
    match record.container.run(&["rm", "-rf", "--", &path]).await {
        Ok(finished) if finished.code == 0 => unary_ok(&json!({})),
        Ok(finished) => unary_error(RpcError::new(
            Code::Internal,
            format!(
                "error removing file or directory: {}",
                String::from_utf8_lossy(&finished.stderr).trim()
            ),
        )),
        Err(error) => unary_error(internal(&error)),
    }
}

/// `{"entry": EntryInfo}` for `path`, or envd's `not_found`.
async fn answer_entry(record: &Record, path: &str) -> Response<Body> {
    match record.container.entry(path, false).await {
        Ok(Some(entry)) => unary_ok(&json!({ "entry": entry_json(record, entry).await })),
        Ok(None) => unary_error(RpcError::new(
            Code::NotFound,
            format!("file not found: lstat {path}: no such file or directory"),
        )),
        Err(error) => unary_error(internal(&error)),
    }
}

fn internal(error: &ContainerError) -> RpcError {
    RpcError::new(
        Code::Internal,
        format!("error getting file info: {}", error_chain(error)),
    )
}

/// `EntryInfo` in protojson (defaults left out).
async fn entry_json(record: &Record, entry: Entry) -> Value {
    let mut info = Map::new();
    info.insert("name".into(), json!(entry.name()));
    let file_type = if entry.is_dir() {
        "FILE_TYPE_DIRECTORY"
    } else if entry.is_symlink() {
        "FILE_TYPE_SYMLINK"
    } else {
        "FILE_TYPE_FILE"
    };
    info.insert("type".into(), json!(file_type));
    info.insert("path".into(), json!(entry.path));
    if entry.size != 0 {
        info.insert("size".into(), json!(entry.size.to_string()));
    }
    let mode = go_mode(entry.mode);
    if mode != 0 {
        info.insert("mode".into(), json!(mode));
    }
    info.insert("permissions".into(), json!(go_mode_string(mode)));
    info.insert("owner".into(), json!(user_name(entry.uid)));
    info.insert("group".into(), json!(user_name(entry.gid)));
    if let Some(text) = OffsetDateTime::from_unix_timestamp(entry.mtime)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
    {
        info.insert("modifiedTime".into(), json!(text));
    }
    if entry.is_symlink() {
        if let Ok(target) = record.container.link_target(&entry.path).await {
            info.insert("symlinkTarget".into(), json!(target));
        }
    }
    Value::Object(info)
}

/// envd's owner name: the user's name for its users, the number otherwise.
fn user_name(id: u32) -> String {
    USERS
        .iter()
        .find(|u| u.uid == u64::from(id))
        .map(|u| u.name.to_owned())
        .unwrap_or_else(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_envd_users_or_numbers() {
        assert_eq!(user_name(1000), "user");
        assert_eq!(user_name(0), "root");
        assert_eq!(user_name(42), "42");
    }
}
