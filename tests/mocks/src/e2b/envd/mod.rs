//! envd, the in-sandbox daemon on port 49983, served by the mock itself for
//! each sandbox (the proxy routes `49983-{id}.{domain}` here) and acting on
//! the sandbox's container. Shapes follow e2b-dev/infra
//! `packages/envd/spec/envd.yaml` and `packages/envd/spec/process/process.proto`.
//!
//! Modelled: `GET /health`, `GET` and `POST /files` ([`files`]),
//! `process.Process/Start`, `SendSignal` and `List` ([`process`]),
//! `filesystem.Filesystem/Stat`, `ListDir`, `MakeDir` and `Remove`
//! ([`filesystem`]) over the
//! Connect protocol ([`connect`]), and `X-Access-Token` for secure
//! sandboxes (every route but `GET /health`, `GET /files`, `POST /files`
//! and `POST /init`; the file routes check the token or a signature
//! themselves). Other envd routes answer `501` (HTTP) or `unimplemented`
//! (Connect) so a client notices it left the model.
//!
//! Users: envd's default user is `user` (home `/home/user`); `root` (home
//! `/root`) is known too, any other name is refused as envd refuses an
//! unknown user. Every process runs as the container's user whatever the
//! name; uploaded files are owned by the named user's uid (1000 or 0).

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::connect::{Code, RpcError, STREAM_JSON, stream_error, unary_error};
use crate::containers::files::clean_path;
use crate::e2b::store::Record;
use crate::http::{Body, full, header, json_as, status, with_body};
use crate::secret::same_secret;

/// The header carrying a secure sandbox's `envdAccessToken`.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// Routes that never need the access token (method and path).
const AUTH_EXCLUDED: [(&str, &str); 4] = [
    ("GET", "/health"),
    ("GET", "/files"),
    ("POST", "/files"),
    ("POST", "/init"),
];

/// A user envd knows.
#[derive(Debug, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: &'static str,
    /// Home directory (where relative paths resolve).
    pub home: &'static str,
    /// Owner uid of files written for this user.
    pub uid: u64,
    /// Owner gid.
    pub gid: u64,
}

/// The users of every mock sandbox; the first is the default.
pub const USERS: [User; 2] = [
    User {
        name: "user",
        home: "/home/user",
        uid: 1000,
        gid: 1000,
    },
    User {
        name: "root",
        home: "/root",
        uid: 0,
        gid: 0,
    },
];

/// Home directories the container makes at start.
pub const HOMES: [&str; 2] = [USERS[0].home, USERS[1].home];

/// The user named `name` (the default when `None`); `Err` carries the
/// unknown name.
pub fn lookup_user(name: Option<&str>) -> Result<&'static User, String> {
    let name = name.unwrap_or(USERS[0].name);
    USERS
        .iter()
        .find(|u| u.name == name)
        .ok_or_else(|| name.to_owned())
}

/// The user of a Connect call: `Authorization: Basic base64("<user>:")`,
/// or the default user without it.
pub fn user_from_headers(headers: &HeaderMap) -> Result<&'static User, RpcError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return lookup_user(None).map_err(|name| invalid_username(&name));
    };
    let name = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| STANDARD.decode(b.trim()).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
        .map(|text| text.split(':').next().unwrap_or_default().to_owned())
        .ok_or_else(|| invalid_username(""))?;
    lookup_user(Some(&name)).map_err(|name| invalid_username(&name))
}

fn invalid_username(name: &str) -> RpcError {
    RpcError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
}

/// A path as envd resolves it for `user`: `~` and relative paths against
/// the home directory, then `.` and `..` removed lexically.
pub fn resolve_path(path: &str, user: &User) -> String {
    let joined = if path == "~" {
        user.home.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{}/{rest}", user.home)
    } else if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{}/{path}", user.home)
    };
    clean_path(&joined)
}

/// envd's HTTP error: `{"code","message"}` as `application/json; charset=utf-8`.
pub fn envd_error(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = json_as(
        code,
        "application/json; charset=utf-8",
        &json!({ "code": code.as_u16(), "message": message.into() }),
    );
    response.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    response
}

/// Serves one envd request for the sandbox `record`.
pub async fn handle(
    record: &Record,
    request: Request<Incoming>,
    cancel: &CancellationToken,
) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    if let Some(token) = &record.envd_token {
        let excluded = AUTH_EXCLUDED.contains(&(method.as_str(), path.as_str()));
        let given = header(&request, ACCESS_TOKEN_HEADER).unwrap_or_default();
        if !excluded && !same_secret(given, token) {
            return envd_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized access, please provide a valid access token or method signing if supported",
            );
        }
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/health") => status(StatusCode::NO_CONTENT),
        (&Method::GET, "/files") => files::download(record, request).await,
        (&Method::POST, "/files") => files::upload(record, request).await,
        (&Method::POST, "/process.Process/Start") => process::start(record, request, cancel).await,
        (&Method::POST, "/process.Process/SendSignal") => {
            process::send_signal(record, request).await
        }
        (&Method::POST, "/process.Process/List") => process::list(record, request).await,
        (&Method::POST, "/filesystem.Filesystem/Stat") => filesystem::stat(record, request).await,
        (&Method::POST, "/filesystem.Filesystem/ListDir") => {
            filesystem::list_dir(record, request).await
        }
        (&Method::POST, "/filesystem.Filesystem/MakeDir") => {
            filesystem::make_dir(record, request).await
        }
        (&Method::POST, "/filesystem.Filesystem/Remove") => {
            filesystem::remove(record, request).await
        }
        (&Method::POST, rpc)
            if rpc.starts_with("/process.Process/")
                || rpc.starts_with("/filesystem.Filesystem/") =>
        {
            let error = RpcError::new(
                Code::Unimplemented,
                format!("the mock does not model {}", &rpc[1..]),
            );
            if header(&request, http::header::CONTENT_TYPE.as_str()) == Some(STREAM_JSON) {
                stream_error(&error)
            } else {
                unary_error(error)
            }
        }
        (_, "/metrics" | "/envs" | "/files/compose") => envd_error(
            StatusCode::NOT_IMPLEMENTED,
            format!("the mock does not model {method} {path}"),
        ),
        _ => with_body(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            full("404 page not found\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_envd() {
        let user = &USERS[0];
        assert_eq!(resolve_path("a.txt", user), "/home/user/a.txt");
        assert_eq!(resolve_path("~/x/../y", user), "/home/user/y");
        assert_eq!(resolve_path("/tmp//z/.", user), "/tmp/z");
        assert_eq!(resolve_path("", user), "/home/user");
        assert_eq!(resolve_path("/../..", user), "/");
        assert_eq!(resolve_path("b", &USERS[1]), "/root/b");
    }

    #[test]
    fn users_come_from_basic_auth() {
        let mut headers = HeaderMap::new();
        assert_eq!(user_from_headers(&headers).unwrap().name, "user");
        let root = format!("Basic {}", STANDARD.encode("root:"));
        headers.insert(http::header::AUTHORIZATION, root.parse().unwrap());
        assert_eq!(user_from_headers(&headers).unwrap().name, "root");
        let nobody = format!("Basic {}", STANDARD.encode("nobody:"));
        headers.insert(http::header::AUTHORIZATION, nobody.parse().unwrap());
        let error = user_from_headers(&headers).unwrap_err();
        assert_eq!(error.message, "invalid username: 'nobody'");
    }
}
