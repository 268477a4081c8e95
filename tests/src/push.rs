//! Helpers for push tests and benchmarks: tar entries written byte by byte
//! (so a hostile bundle really is hostile, not whatever a tar library lets
//! through), gzip, signed pushes of raw bytes, and listings of trees.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use silo::client::AgentClient;
use silo_protocol::push::{Declared, path_and_query, path_and_query_declared};

/// Size of a tar block.
pub const BLOCK: usize = 512;

/// One tar entry: a ustar header for `name` (raw bytes, up to 100) with
/// `typeflag`, `link` as its link name, and `data` padded to a block.
pub fn tar_entry(name: &[u8], typeflag: u8, data: &[u8], link: &[u8]) -> Vec<u8> {
    assert!(
        name.len() <= 100 && link.len() <= 100,
        "ustar names are 100 bytes at most"
    );
    let mut header = [0u8; BLOCK];
    header[..name.len()].copy_from_slice(name);
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], data.len() as u64);
    octal(&mut header[136..148], 0);
    header[156] = typeflag;
    header[157..157 + link.len()].copy_from_slice(link);
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    // The checksum is computed with its own field read as spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u64 = header.iter().map(|b| u64::from(*b)).sum();
    header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    out
}

/// A regular file entry.
pub fn tar_file(name: &str, data: &[u8]) -> Vec<u8> {
    tar_entry(name.as_bytes(), b'0', data, b"")
}

/// A tar of `entries` with its end marker, gzip-compressed.
pub fn bundle_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut raw: Vec<u8> = entries.concat();
    raw.extend_from_slice(&[0u8; 2 * BLOCK]);
    gzip(&raw)
}

/// Gzip at the default level.
pub fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(raw).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// Pushes raw bytes (signed with their true hash); returns status and JSON body.
pub async fn push_raw(
    client: &AgentClient,
    mount: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let sha = silo_protocol::auth::body_sha256(&body);
    push_claiming(client, mount, body, &sha).await
}

/// Pushes raw bytes (signed with their true hash) declaring `declared` of
/// them in the query; returns status and JSON body.
pub async fn push_declaring(
    client: &AgentClient,
    mount: &str,
    body: Vec<u8>,
    declared: Declared,
) -> (u16, serde_json::Value) {
    let sha = silo_protocol::auth::body_sha256(&body);
    let response = client
        .request_streamed(
            http::Method::POST,
            &path_and_query_declared(mount, declared),
            body.into(),
            &sha,
            None,
        )
        .await
        .expect("push request");
    let json = serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status.as_u16(), json)
}

/// Pushes raw bytes signed as if their SHA-256 were `sha256`.
pub async fn push_claiming(
    client: &AgentClient,
    mount: &str,
    body: Vec<u8>,
    sha256: &str,
) -> (u16, serde_json::Value) {
    let response = client
        .request_streamed(
            http::Method::POST,
            &path_and_query(mount),
            body.into(),
            sha256,
            None,
        )
        .await
        .expect("push request");
    let json = serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status.as_u16(), json)
}

/// Everything under `dir` (not following symlinks below it): path → what it
/// is (`dir`, `link -> target`, or `file <mode> <contents>`).
pub fn listing(dir: &Path) -> BTreeMap<String, String> {
    listing_with(dir, |data| String::from_utf8_lossy(data).into_owned())
}

/// [`listing`] with each file's contents shown by `show`.
pub fn listing_with(dir: &Path, show: impl Fn(&[u8]) -> String) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out, &show);
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, String>,
    show: &dyn Fn(&[u8]) -> String,
) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let key = path
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).expect("readlink");
            out.insert(key, format!("link -> {}", target.display()));
        } else if meta.is_dir() {
            out.insert(key, "dir".into());
            walk(root, &path, out, show);
        } else {
            let data = std::fs::read(&path).expect("read");
            let mode = meta.permissions().mode() & 0o7777;
            out.insert(key, format!("file {mode:o} {}", show(&data)));
        }
    }
}

/// Names in `dir` that are leftovers of pushes (`.partial-*`, `.link-*`).
pub fn leftovers(store: &Path) -> Vec<String> {
    std::fs::read_dir(store)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(".partial-") || n.starts_with(".link-"))
        .collect()
}

/// Starts a signed push on a raw socket and sends only the first `part`
/// bytes of `body`, so the agent is mid-push (and stays so, until its idle
/// timeout) while the caller looks: extracting when the push declares its
/// entries and unpacked size, as silo's client does, else spooling the
/// body to count it first. Dropping the stream ends it.
pub fn start_partial_push(
    socket: &Path,
    key: &silo_protocol::auth::Key,
    (mount, declared): (&str, Declared),
    body: &[u8],
    part: usize,
) -> std::os::unix::net::UnixStream {
    let target = path_and_query_declared(mount, declared);
    start_signed_post(socket, key, &target, body, part)
}

/// Sends a signed `POST path_and_query` with the first `part` bytes of
/// `body` on a raw socket, leaving the rest (and the answer) to the caller.
pub fn start_signed_post(
    socket: &Path,
    key: &silo_protocol::auth::Key,
    path_and_query: &str,
    body: &[u8],
    part: usize,
) -> std::os::unix::net::UnixStream {
    let sha = silo_protocol::auth::body_sha256(body);
    let signed =
        silo_protocol::auth::sign(key, "POST", path_and_query, &sha).expect("signing a request");
    let mut head = format!(
        "POST {path_and_query} HTTP/1.1\r\nHost: agent\r\nContent-Length: {}\r\n{}: {}\r\n",
        body.len(),
        silo_protocol::http::HEADER_PROTOCOL,
        silo_protocol::PROTOCOL_VERSION
    );
    for (name, value) in signed.pairs() {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).expect("connecting to the agent");
    stream.write_all(head.as_bytes()).expect("sending the head");
    stream
        .write_all(&body[..part])
        .expect("sending part of the body");
    stream
}

/// `len` bytes no compressor can shrink (xorshift from `seed`), so a
/// bundle of them is as large as its files.
pub fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `silo push DIR --mount MOUNT --all --json` with a short retry budget,
/// for tests where one of the sandboxes cannot be reached.
pub fn push_to_all(cli: &crate::Cli, dir: &Path, mount: &str) -> std::process::Output {
    let dir = dir.display().to_string();
    cli.run(&[
        "push",
        &dir,
        "--mount",
        mount,
        "--all",
        "--retry-budget",
        "1.5",
        "--json",
    ])
}
