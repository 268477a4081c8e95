//! The toolbox's file routes the current SDKs use: `files/bulk-upload`
//! (multipart `files[i].path` and `files[i].file` pairs), `files/bulk-download`
//! (`{"paths": [...]}` in, a multipart answer out: a part named `file` per
//! file, or one named `error` with a JSON `ErrorResponse`), and `GET /files`
//! (a directory listing as `FileInfo`s, `depth` levels deep), as the daemon
//! (daytonaio/daytona `apps/daemon/pkg/toolbox/fs`) answers them.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::json;
use silo_protocol::http::error_chain;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Call;
use super::files::{rfc5987, write};
use crate::containers::entries::{Entry, go_mode, go_mode_string};
use crate::containers::files::{PathKind, Written};
use crate::daytona::model::go_time;
use crate::daytona::reply::aborted;
use crate::http::{Body, full, header, json_as, query_pairs, query_value, read_body, with_body};

/// Largest bulk upload the mock takes (it holds the body in memory).
pub const MAX_BULK_BYTES: usize = 256 << 20;
/// Largest bulk-download request body.
const MAX_PATHS_BYTES: usize = 1 << 20;
/// The boundary of bulk-download answers (the daemon's constant).
const BOUNDARY: &str = "DAYTONA-FILE-BOUNDARY";
/// JSON answers, as gin labels them.
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// One written file of a bulk upload.
#[derive(Serialize)]
struct FileResult {
    path: String,
    bytes: u64,
}

/// `POST /files/bulk-upload`: `200 {files}`, or `400 {errors, files}`
/// when any pair failed (the others are written).
pub async fn upload(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let content_type = header(&request, CONTENT_TYPE.as_str())
        .unwrap_or_default()
        .to_owned();
    let invalid = || {
        json_as(
            StatusCode::BAD_REQUEST,
            JSON_UTF8,
            &json!({ "errors": ["invalid multipart form"] }),
        )
    };
    let Ok(boundary) = multer::parse_boundary(&content_type) else {
        return invalid();
    };
    let Ok(body) = read_body(request.into_body(), MAX_BULK_BYTES).await else {
        return invalid();
    };
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut destinations = std::collections::HashMap::new();
    let mut errors = Vec::new();
    let mut files = Vec::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(error) => {
                errors.push(format!("reading part: {error}"));
                break;
            }
        };
        let name = field.name().unwrap_or_default().to_owned();
        let index = index_of(&name);
        if name.ends_with(".path") {
            match field.text().await {
                Ok(text) if !text.trim().is_empty() => {
                    destinations.insert(index, text.trim().to_owned());
                }
                Ok(_) => errors.push(format!("path[{index}]: empty path")),
                Err(error) => errors.push(format!("path[{index}]: {error}")),
            }
        } else if name.ends_with(".file") {
            let Some(destination) = destinations.get(&index).cloned() else {
                errors.push(format!("file[{index}]: missing .path metadata"));
                continue;
            };
            let data = match field.bytes().await {
                Ok(data) => data,
                Err(error) => {
                    errors.push(format!("{destination}: write: {error}"));
                    continue;
                }
            };
            let target = call.resolve(&destination);
            match write(call, &target, &data).await {
                Ok(Written::File) => files.push(FileResult {
                    path: destination,
                    bytes: data.len() as u64,
                }),
                Ok(Written::IsDirectory) => errors.push(format!(
                    "{destination}: create: open {destination}: is a directory"
                )),
                Err(error) => {
                    errors.push(format!("{destination}: create: {}", error_chain(&error)))
                }
            }
        }
    }
    if errors.is_empty() {
        json_as(StatusCode::OK, JSON_UTF8, &json!({ "files": files }))
    } else {
        json_as(
            StatusCode::BAD_REQUEST,
            JSON_UTF8,
            &json!({ "errors": errors, "files": files }),
        )
    }
}

/// The `i` of `files[i].path` or `files[i].file`.
fn index_of(name: &str) -> String {
    name.trim_start_matches("files[")
        .trim_end_matches(".path")
        .trim_end_matches(".file")
        .trim_end_matches(']')
        .to_owned()
}

#[derive(Deserialize)]
struct DownloadRequest {
    #[serde(default)]
    paths: Vec<String>,
}

/// `POST /files/bulk-download`: the files as multipart parts.
pub async fn download(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let refused = || {
        json_as(
            StatusCode::BAD_REQUEST,
            JSON_UTF8,
            &json!({ "error": "request body must be {\"paths\": [ ... ]} and non-empty" }),
        )
    };
    let Ok(body) = read_body(request.into_body(), MAX_PATHS_BYTES).await else {
        return refused();
    };
    let Ok(parsed) = serde_json::from_slice::<DownloadRequest>(&body) else {
        return refused();
    };
    if parsed.paths.is_empty() {
        return refused();
    }
    let mut out = BytesMut::new();
    for path in &parsed.paths {
        match read_one(call, path).await {
            Ok(data) => {
                part(
                    &mut out,
                    "file",
                    path,
                    "application/octet-stream",
                    Some(data.len()),
                );
                out.put_slice(&data);
            }
            Err((status, code, message)) => {
                let error = json!({
                    "statusCode": status.as_u16(),
                    "message": message,
                    "code": code,
                    "timestamp": go_time(std::time::SystemTime::now()),
                    "path": path,
                    "method": "POST",
                });
                part(
                    &mut out,
                    "error",
                    path,
                    "application/json; charset=utf-8",
                    None,
                );
                out.put_slice(error.to_string().as_bytes());
            }
        }
        out.put_slice(b"\r\n");
    }
    out.put_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    let mut response = with_body(StatusCode::OK, "multipart/form-data", full(out.freeze()));
    if let Ok(value) = format!("multipart/form-data; boundary={BOUNDARY}").parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// A part's opening (Go's `multipart.Writer`): boundary line and headers.
fn part(out: &mut BytesMut, name: &str, path: &str, content_type: &str, length: Option<usize>) {
    out.put_slice(format!("--{BOUNDARY}\r\n").as_bytes());
    let latin: String = path
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let encoded = rfc5987(path);
    out.put_slice(
        format!(
            "Content-Disposition: form-data; name=\"{name}\"; filename=\"{latin}\"; filename*=utf-8''{encoded}\r\n"
        )
        .as_bytes(),
    );
    if let Some(length) = length {
        out.put_slice(format!("Content-Length: {length}\r\n").as_bytes());
    }
    out.put_slice(format!("Content-Type: {content_type}\r\n\r\n").as_bytes());
}

/// The bytes of one requested file, or the daemon's status, code and message.
async fn read_one(
    call: &Call<'_>,
    path: &str,
) -> Result<Bytes, (StatusCode, &'static str, String)> {
    if path.is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "INVALID_FILE_PATH",
            "invalid file path: path is empty".to_owned(),
        ));
    }
    let target = call.resolve(path);
    let failed = |error: &dyn std::error::Error| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "FILE_READ_FAILED",
            format!("failed to open file: {error}"),
        )
    };
    match call.record.container.stat(&target).await {
        Ok(PathKind::Missing) => {
            return Err((
                StatusCode::NOT_FOUND,
                "FILE_NOT_FOUND",
                format!("file not found: {path}"),
            ));
        }
        Ok(PathKind::Directory) => {
            return Err((
                StatusCode::BAD_REQUEST,
                "INVALID_FILE_PATH",
                format!("invalid file path: path points to a directory: {path}"),
            ));
        }
        Ok(_) => {}
        Err(error) => return Err(failed(&error)),
    }
    match call.record.container.download(&target).await {
        Ok(Some(bytes)) => Ok(Bytes::from(bytes)),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            "FILE_NOT_FOUND",
            format!("file not found: {path}"),
        )),
        Err(error) => Err(failed(&error)),
    }
}

/// `FileInfo` as the daemon writes it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileInfo {
    name: String,
    size: u64,
    mode: String,
    mod_time: String,
    modified_at: String,
    is_dir: bool,
    owner: String,
    group: String,
    permissions: String,
    path: String,
}

/// `GET /files?path=&depth=`: the entries below a directory (`.`, the
/// home, by default), `depth` levels deep (1 by default).
pub async fn list(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let path = query_value(&query, "path")
        .filter(|p| !p.is_empty())
        .unwrap_or(".");
    let depth = match query_value(&query, "depth") {
        None => 1,
        Some(text) => match text.parse::<u32>() {
            Ok(depth) if depth >= 1 => depth,
            _ => return aborted(StatusCode::BAD_REQUEST),
        },
    };
    let target = call.resolve(path);
    match call.record.container.entry(&target, true).await {
        Ok(None) => return aborted(StatusCode::NOT_FOUND),
        Ok(Some(entry)) if !entry.is_dir() => return aborted(StatusCode::BAD_REQUEST),
        Ok(Some(_)) => {}
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "listing a toolbox directory failed");
            return aborted(StatusCode::INTERNAL_SERVER_ERROR);
        }
    }
    match call.record.container.walk(&target, depth).await {
        Ok(entries) => {
            let infos: Vec<FileInfo> = entries.iter().map(file_info).collect();
            json_as(StatusCode::OK, JSON_UTF8, &infos)
        }
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "listing a toolbox directory failed");
            aborted(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

fn file_info(entry: &Entry) -> FileInfo {
    let mode = go_mode(entry.mode);
    let at = OffsetDateTime::from_unix_timestamp(entry.mtime).ok();
    FileInfo {
        name: entry.name().to_owned(),
        size: entry.size,
        mode: go_mode_string(mode),
        // Go's `time.String()`, to the second here.
        mod_time: at
            .map(|t| {
                format!(
                    "{:04}-{:02}-{:02} {:02}:{:02}:{:02} +0000 UTC",
                    t.year(),
                    u8::from(t.month()),
                    t.day(),
                    t.hour(),
                    t.minute(),
                    t.second()
                )
            })
            .unwrap_or_default(),
        modified_at: at.and_then(|t| t.format(&Rfc3339).ok()).unwrap_or_default(),
        is_dir: entry.is_dir(),
        owner: entry.uid.to_string(),
        group: entry.gid.to_string(),
        permissions: format!("{:04o}", entry.mode & 0o7777),
        path: entry.path.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_come_from_either_field_name() {
        assert_eq!(index_of("files[0].path"), "0");
        assert_eq!(index_of("files[12].file"), "12");
    }

    #[test]
    fn parts_carry_both_filenames() {
        let mut out = BytesMut::new();
        part(
            &mut out,
            "file",
            "a b.txt",
            "application/octet-stream",
            Some(3),
        );
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(text.starts_with("--DAYTONA-FILE-BOUNDARY\r\n"));
        assert!(
            text.contains("name=\"file\"; filename=\"a b.txt\"; filename*=utf-8''a%20b.txt\r\n")
        );
        assert!(text.ends_with("Content-Type: application/octet-stream\r\n\r\n"));
    }

    #[test]
    fn file_infos_read_as_the_daemon_writes_them() {
        let entry = Entry {
            mode: 0o100644,
            size: 3,
            mtime: 1_700_000_000,
            uid: 0,
            gid: 0,
            path: "/home/daytona/x.txt".into(),
        };
        let info = serde_json::to_value(file_info(&entry)).unwrap();
        assert_eq!(info["mode"], "-rw-r--r--");
        assert_eq!(info["permissions"], "0644");
        assert_eq!(info["modTime"], "2023-11-14 22:13:20 +0000 UTC");
        assert_eq!(info["modifiedAt"], "2023-11-14T22:13:20Z");
        assert_eq!(info["isDir"], false);
    }
}
