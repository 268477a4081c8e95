//! The toolbox's `files/upload`, `files/download` and `files/permissions`,
//! over the container's archive endpoints and its `chmod`/`chown`.
//!
//! As the daemon: an upload takes the first multipart part named `file`
//! and writes it to `path` (parents made; a new file gets 0644, an existing
//! one keeps its mode) and answers `200` with no body; a download answers
//! the bytes as an attachment. Every refusal is gin's bare abort: the
//! status (`400` bad or missing input, `404` nothing at the path) and no
//! body.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use silo_protocol::http::error_chain;

use super::Call;
use crate::containers::ContainerError;
use crate::containers::files::{Ownership, PathKind, Written};
use crate::daytona::reply::aborted;
use crate::http::{Body, full, header, query_pairs, query_value, read_body, status, with_body};

/// Largest upload the mock takes (it holds the body in memory).
pub const MAX_UPLOAD_BYTES: usize = 256 << 20;
/// Mode of a file that did not exist before (0666 less the usual umask).
const NEW_FILE_MODE: u32 = 0o644;
/// Owner of written files: the container's user, as the daemon runs as it.
const OWNER: (u64, u64) = (0, 0);

/// `POST /files/upload?path=`: multipart field `file`.
pub async fn upload(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let Some(path) = query_value(&query, "path").filter(|p| !p.is_empty()) else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    let target = call.resolve(path);
    let content_type = header(&request, CONTENT_TYPE.as_str())
        .unwrap_or_default()
        .to_owned();
    let Ok(boundary) = multer::parse_boundary(&content_type) else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    let Ok(body) = read_body(request.into_body(), MAX_UPLOAD_BYTES).await else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    let Some(data) = first_file(body, boundary).await else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    match write(call, &target, &data).await {
        Ok(Written::File) => status(StatusCode::OK),
        Ok(Written::IsDirectory) => aborted(StatusCode::BAD_REQUEST),
        Err(error) => engine_failed(&target, &error),
    }
}

/// Writes `data` to `target` as the daemon does (`os.Create`: parents
/// made, a new file 0644, an existing one keeps its mode, owned by the
/// container's user).
pub async fn write(call: &Call<'_>, target: &str, data: &[u8]) -> Result<Written, ContainerError> {
    let owner = Ownership {
        uid: OWNER.0,
        gid: OWNER.1,
        mode: NEW_FILE_MODE,
    };
    call.record.container.write_file(target, data, owner).await
}

/// `GET /files/download?path=`: the file's bytes.
pub async fn download(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let Some(path) = query_value(&query, "path").filter(|p| !p.is_empty()) else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    let target = call.resolve(path);
    match call.record.container.stat(&target).await {
        Ok(PathKind::Missing) => return aborted(StatusCode::NOT_FOUND),
        Ok(PathKind::Directory) => return aborted(StatusCode::BAD_REQUEST),
        Ok(_) => {}
        Err(error) => return engine_failed(&target, &error),
    }
    let bytes = match call.record.container.download(&target).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return aborted(StatusCode::NOT_FOUND),
        Err(error) => return engine_failed(&target, &error),
    };
    let name = target.rsplit('/').next().unwrap_or_default();
    let mut response = with_body(StatusCode::OK, "application/octet-stream", full(bytes));
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&disposition(name)) {
        headers.insert(CONTENT_DISPOSITION, value);
    }
    headers.insert(
        "content-description",
        HeaderValue::from_static("File Transfer"),
    );
    headers.insert(
        "content-transfer-encoding",
        HeaderValue::from_static("binary"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("must-revalidate"));
    headers.insert("expires", HeaderValue::from_static("0"));
    headers.insert("pragma", HeaderValue::from_static("public"));
    response
}

/// `POST /files/permissions?path=&mode=&owner=&group=`.
pub async fn permissions(call: &Call<'_>, request: Request<Incoming>) -> Response<Body> {
    let query = query_pairs(&request);
    let Some(path) = query_value(&query, "path").filter(|p| !p.is_empty()) else {
        return aborted(StatusCode::BAD_REQUEST);
    };
    let target = call.resolve(path);
    match call.record.container.stat(&target).await {
        Ok(PathKind::Missing) => return aborted(StatusCode::NOT_FOUND),
        Ok(_) => {}
        Err(error) => return engine_failed(&target, &error),
    }
    if let Some(mode) = query_value(&query, "mode").filter(|m| !m.is_empty()) {
        let Ok(bits) = u32::from_str_radix(mode, 8) else {
            return aborted(StatusCode::BAD_REQUEST);
        };
        let octal = format!("{bits:o}");
        match call.record.container.run(&["chmod", &octal, &target]).await {
            Ok(done) if done.code == 0 => {}
            Ok(_) => return aborted(StatusCode::BAD_REQUEST),
            Err(error) => return engine_failed(&target, &error),
        }
    }
    let owner = query_value(&query, "owner").filter(|o| !o.is_empty());
    let group = query_value(&query, "group").filter(|g| !g.is_empty());
    if owner.is_some() || group.is_some() {
        let spec = format!(
            "{}:{}",
            owner.unwrap_or_default(),
            group.unwrap_or_default()
        );
        let spec = spec.trim_end_matches(':');
        match call.record.container.run(&["chown", spec, &target]).await {
            Ok(done) if done.code == 0 => {}
            Ok(_) => return aborted(StatusCode::BAD_REQUEST),
            Err(error) => return engine_failed(&target, &error),
        }
    }
    status(StatusCode::OK)
}

/// The bytes of the first part named `file`.
async fn first_file(body: Bytes, boundary: String) -> Option<Bytes> {
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    while let Some(field) = multipart.next_field().await.ok()? {
        if field.name() == Some("file") {
            return field.bytes().await.ok();
        }
    }
    None
}

/// `attachment; filename="…"; filename*=utf-8''…`, as the daemon writes it.
fn disposition(name: &str) -> String {
    let latin: String = name
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{latin}\"; filename*=utf-8''{}",
        rfc5987(name)
    )
}

/// A name percent-encoded as RFC 5987's `attr-char`s allow, for a
/// `filename*=utf-8''…` parameter (the daemon's `encodeRFC5987`).
pub fn rfc5987(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn engine_failed(path: &str, error: &ContainerError) -> Response<Body> {
    tracing::warn!(path, error = %error_chain(error), "a toolbox file operation failed in the engine");
    aborted(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispositions_carry_both_names() {
        assert_eq!(
            disposition("hello.txt"),
            "attachment; filename=\"hello.txt\"; filename*=utf-8''hello.txt"
        );
        assert_eq!(
            disposition("file (1).txt"),
            "attachment; filename=\"file (1).txt\"; filename*=utf-8''file%20%281%29.txt"
        );
    }
}
