//! envd's `GET /files` and `POST /files`, over the container's archive
//! endpoints.
//!
//! Both check a secure sandbox's access: the `X-Access-Token` header if
//! present, otherwise a `signature` query (`v1_` + unpadded base64 of
//! SHA-256 over `path:operation:username:token[:expiration]`). Uploads take
//! `multipart/form-data` (every part named `file`) or
//! `application/octet-stream` (with `path`), create parent directories,
//! keep an existing file's mode (new files get 0644) and answer with the
//! written entries. Not modelled: gzip bodies (refused with `501`), gzip
//! answers (downloads are always identity), `X-Metadata-*` headers
//! (ignored), `507`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use http::header::{CONTENT_DISPOSITION, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{ACCESS_TOKEN_HEADER, User, envd_error, lookup_user, resolve_path};
use crate::containers::files::{Ownership, PathKind, Written};
use crate::e2b::store::Record;
use crate::http::{Body, full, header, json, query_pairs, query_value, read_body, with_body};
use crate::secret::same_secret;
use silo_protocol::http::error_chain;

/// Largest upload the mock takes (it holds the body in memory).
pub const MAX_UPLOAD_BYTES: usize = 256 << 20;
/// Mode of a file that did not exist before (0666 less envd's umask).
const NEW_FILE_MODE: u32 = 0o644;

/// `GET /files`: the file's bytes.
pub async fn download(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let path = query_value(&query, "path").unwrap_or_default();
    let username = query_value(&query, "username");
    if let Err(message) = check_access(record, &request, &query, path, username, "read") {
        return envd_error(StatusCode::UNAUTHORIZED, message);
    }
    let user = match lookup_user(username) {
        Ok(user) => user,
        Err(name) => return unknown_user(&name),
    };
    let resolved = resolve_path(path, user);
    match record.container.stat(&resolved).await {
        Ok(PathKind::Missing) => return not_found(&resolved),
        Ok(PathKind::Directory) => {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!("path '{resolved}' is a directory"),
            );
        }
        Ok(_) => {}
        Err(error) => return internal(&resolved, &error),
    }
    let bytes = match record.container.download(&resolved).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return not_found(&resolved),
        Err(error) => return internal(&resolved, &error),
    };
    let name = resolved.rsplit('/').next().unwrap_or_default();
    let mut response = with_body(StatusCode::OK, content_type(name), full(bytes));
    if let Ok(value) = HeaderValue::from_str(&disposition(name)) {
        response.headers_mut().insert(CONTENT_DISPOSITION, value);
    }
    response
        .headers_mut()
        .insert("vary", HeaderValue::from_static("Accept-Encoding"));
    response
}

/// `POST /files`: writes each file, answers `[EntryInfo]`.
pub async fn upload(record: &Record, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let path = query_value(&query, "path");
    let username = query_value(&query, "username");
    let check = check_access(
        record,
        &request,
        &query,
        path.unwrap_or_default(),
        username,
        "write",
    );
    if let Err(message) = check {
        return envd_error(StatusCode::UNAUTHORIZED, message);
    }
    if header(&request, CONTENT_ENCODING.as_str())
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return envd_error(
            StatusCode::NOT_IMPLEMENTED,
            "the mock does not model Content-Encoding on uploads",
        );
    }
    let user = match lookup_user(username) {
        Ok(user) => user,
        Err(name) => return unknown_user(&name),
    };
    let content_type = header(&request, CONTENT_TYPE.as_str())
        .unwrap_or_default()
        .to_owned();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let body = match read_body(request.into_body(), MAX_UPLOAD_BYTES).await {
        Ok(body) => body,
        Err(error) => return envd_error(StatusCode::BAD_REQUEST, error.to_string()),
    };
    let files = if media == "application/octet-stream" {
        let Some(path) = path else {
            return envd_error(
                StatusCode::BAD_REQUEST,
                "path query parameter is required for raw body upload",
            );
        };
        vec![(resolve_path(path, user), body)]
    } else if media.starts_with("multipart/") {
        match multipart_files(&content_type, body, path, user).await {
            Ok(files) => files,
            Err(refused) => return refused,
        }
    } else {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!(
                "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
            ),
        );
    };
    let mut entries = Vec::new();
    for (target, data) in files {
        if entries
            .iter()
            .any(|e: &serde_json::Value| e["path"] == target)
        {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "you cannot upload multiple files to the same path '{target}' in one upload request, only the first specified file was uploaded"
                ),
            );
        }
        if let Err(refused) = write_file(record, &target, &data, user).await {
            return refused;
        }
        let name = target.rsplit('/').next().unwrap_or_default().to_owned();
        entries.push(json!({ "path": target, "name": name, "type": "file" }));
    }
    json(StatusCode::OK, &entries)
}

/// Writes one file, following a final symlink as `open(2)` would.
async fn write_file(
    record: &Record,
    target: &str,
    data: &[u8],
    user: &User,
) -> Result<(), Response<Body>> {
    let owner = Ownership {
        uid: user.uid,
        gid: user.gid,
        mode: NEW_FILE_MODE,
    };
    match record.container.write_file(target, data, owner).await {
        Ok(Written::File) => Ok(()),
        Ok(Written::IsDirectory) => Err(envd_error(
            StatusCode::BAD_REQUEST,
            format!("path is a directory: {target}"),
        )),
        Err(error) => Err(internal(target, &error)),
    }
}

/// The parts named `file` of a multipart body, with their destinations.
async fn multipart_files(
    content_type: &str,
    body: Bytes,
    path: Option<&str>,
    user: &User,
) -> Result<Vec<(String, Bytes)>, Response<Body>> {
    let malformed = |error: multer::Error| {
        envd_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error parsing multipart form: {error}"),
        )
    };
    let boundary = multer::parse_boundary(content_type).map_err(malformed)?;
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut files = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(malformed)? {
        if field.name() != Some("file") {
            continue;
        }
        let destination = match path {
            Some(path) => path.to_owned(),
            None => field.file_name().unwrap_or_default().to_owned(),
        };
        let data = field.bytes().await.map_err(malformed)?;
        files.push((resolve_path(&destination, user), data));
    }
    Ok(files)
}

/// envd's `validateSigning`: `Ok` for an open sandbox, a matching token
/// header, or a valid unexpired signature.
fn check_access(
    record: &Record,
    request: &Request<Incoming>,
    query: &[(String, String)],
    path: &str,
    username: Option<&str>,
    operation: &str,
) -> Result<(), &'static str> {
    let Some(token) = &record.envd_token else {
        return Ok(());
    };
    if let Some(given) = header(request, ACCESS_TOKEN_HEADER).filter(|g| !g.is_empty()) {
        return if same_secret(given, token) {
            Ok(())
        } else {
            Err("access token present in header but does not match")
        };
    }
    let signature = query_value(query, "signature").ok_or("missing signature query parameter")?;
    let expiration = match query_value(query, "signature_expiration") {
        Some(text) => Some(text.parse::<i64>().map_err(|_| "invalid signature")?),
        None => None,
    };
    let expected = sign(
        path,
        operation,
        username.unwrap_or_default(),
        token,
        expiration,
    );
    if !same_secret(signature, &expected) {
        return Err("invalid signature");
    }
    if expiration.is_some_and(|exp| exp < now_unix()) {
        return Err("signature is already expired");
    }
    Ok(())
}

/// The signature envd expects for a file operation.
pub fn sign(
    path: &str,
    operation: &str,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut text = format!("{path}:{operation}:{username}:{token}");
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(text.as_bytes()))
    )
}

/// envd's answer to an unknown user.
fn unknown_user(name: &str) -> Response<Body> {
    envd_error(
        StatusCode::UNAUTHORIZED,
        format!("error looking up user '{name}': user: unknown user {name}"),
    )
}

fn not_found(path: &str) -> Response<Body> {
    envd_error(
        StatusCode::NOT_FOUND,
        format!("path '{path}' does not exist"),
    )
}

fn internal(path: &str, error: &crate::containers::ContainerError) -> Response<Body> {
    envd_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("error accessing '{path}': {}", error_chain(error)),
    )
}

/// The content type of a download, from its extension.
fn content_type(name: &str) -> &'static str {
    match name
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .as_deref()
    {
        Some("txt") => "text/plain; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("js") => "text/javascript; charset=utf-8",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

/// `inline; filename=…`, quoted when the name is not a plain token.
fn disposition(name: &str) -> String {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b));
    if token {
        format!("inline; filename={name}")
    } else {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        format!("inline; filename=\"{escaped}\"")
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_have_no_padding() {
        let signature = sign("/home/user/a.txt", "read", "", "token", None);
        assert!(signature.starts_with("v1_"));
        assert!(!signature.ends_with('='));
        assert_eq!(signature.len(), 3 + 43);
        assert_ne!(
            signature,
            sign("/home/user/a.txt", "write", "", "token", None)
        );
        assert_ne!(
            signature,
            sign("/home/user/a.txt", "read", "", "token", Some(1))
        );
    }

    #[test]
    fn dispositions_quote_when_needed() {
        assert_eq!(disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(disposition("a b.txt"), "inline; filename=\"a b.txt\"");
    }
}
