//! The shared tier of the blob store: a fleet's bucket on the S3 API
//! (`SILO_STORE_URL=s3://bucket/prefix`, with the endpoint and credentials
//! from the standard `AWS_*` variables).
//!
//! Every host keeps its own store under its home; with a shared tier that
//! store is a cache. A snapshot's blobs are put in the bucket before the
//! snapshot is recorded, so a recorded snapshot is durable there, and any
//! host can restore or fork it: a blob missing from the cache is fetched
//! when first read, through a [`super::BlobWriter`], so its digest is
//! checked as it lands like any blob's. Blobs keep their names
//! (`PREFIX/blobs/sha256/HEX`) and are never rewritten.
//!
//! The store's reads are synchronous (callers run them on blocking
//! threads, or briefly inline), so the client runs on a small runtime of
//! its own: a synchronous caller hands it a request and waits for the
//! answer on a channel, which works from any thread.

mod http;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{Digest, Store, StoreError};

/// Names the bucket (and the prefix in it) a fleet's blobs live in.
pub const STORE_URL_ENV: &str = "SILO_STORE_URL";
/// Trusted roots for the S3 endpoint besides the system's.
const CA_BUNDLE_ENV: &str = "AWS_CA_BUNDLE";
/// How long one request may keep retrying a server that does not answer
/// (the client's own backoff); what a caller waits for beyond is its own.
const REQUEST_RETRY: Duration = Duration::from_secs(10);
/// Parts of a large blob's upload, and the size above which it is split.
const PART_BYTES: usize = 16 << 20;

/// A fleet's bucket, shared by every host.
#[derive(Clone)]
pub struct SharedStore(Arc<Inner>);

struct Inner {
    /// `s3://bucket/prefix`, as the user gave it (for messages).
    url: String,
    bucket: AmazonS3,
    /// The prefix every key starts with (no leading or trailing `/`).
    prefix: String,
    /// The runtime the client's requests run on; taken when dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedStore").field(&self.0.url).finish()
    }
}

impl PartialEq for SharedStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedStore {}

impl Drop for Inner {
    fn drop(&mut self) {
        // A runtime may not be dropped where blocking is not allowed (an
        // async task); shutting it down in the background never blocks.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One blob in the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedBlob {
    /// Its name.
    pub digest: Digest,
    /// Its length.
    pub size: u64,
    /// When it was put there.
    pub modified: SystemTime,
}

impl SharedStore {
    /// The bucket `SILO_STORE_URL` names, if it is set.
    pub fn from_env() -> Result<Option<Self>, SharedError> {
        match std::env::var(STORE_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::open(url.trim()).map(Some),
            _ => Ok(None),
        }
    }

    /// The bucket `url` (`s3://bucket[/prefix]`) names, reached as the
    /// `AWS_*` variables say (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`).
    pub fn open(url: &str) -> Result<Self, SharedError> {
        let bad = |reason: &str| SharedError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("it names no bucket"));
        }
        let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()));
        let ca_pem = std::env::var_os(CA_BUNDLE_ENV)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from);
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_http_connector(http::Connector { ca_pem })
            .with_retry(object_store::RetryConfig {
                retry_timeout: REQUEST_RETRY,
                ..object_store::RetryConfig::default()
            });
        if let Some(endpoint) = &endpoint {
            // A self-hosted server (Garage, MinIO, Ceph) is addressed by
            // path, on whatever scheme its URL says.
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let bucket = builder.build().map_err(|source| SharedError::Config {
            url: url.to_owned(),
            source,
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("silo-shared-store")
            .enable_all()
            .build()
            .map_err(|e| SharedError::Runtime(e.to_string()))?;
        Ok(Self(Arc::new(Inner {
            url: url.to_owned(),
            bucket,
            prefix: prefix.trim_matches('/').to_owned(),
            runtime: Some(runtime),
        })))
    }

    /// `s3://bucket/prefix`, as given.
    pub fn url(&self) -> &str {
        &self.0.url
    }

    fn key(&self, digest: &Digest) -> Key {
        let name = format!("blobs/sha256/{}", digest.as_str());
        if self.0.prefix.is_empty() {
            Key::from(name)
        } else {
            Key::from(format!("{}/{name}", self.0.prefix))
        }
    }

    fn blobs_prefix(&self) -> Key {
        if self.0.prefix.is_empty() {
            Key::from("blobs/sha256")
        } else {
            Key::from(format!("{}/blobs/sha256", self.0.prefix))
        }
    }

    /// Runs `work` on the client's runtime and waits for it, from any
    /// thread (an async task's included: it waits as a file read would).
    fn wait<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, SharedError>> + Send + 'static,
    ) -> Result<T, SharedError> {
        let Some(runtime) = &self.0.runtime else {
            return Err(SharedError::Runtime("the client's runtime is gone".into()));
        };
        let (done, answer) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let _ = done.send(work.await);
        });
        answer
            .recv()
            .map_err(|_| SharedError::Runtime("a request to the shared store was dropped".into()))?
    }

    /// Runs `work` on the client's runtime, awaited from async code.
    async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, SharedError>> + Send + 'static,
    ) -> Result<T, SharedError> {
        let Some(runtime) = &self.0.runtime else {
            return Err(SharedError::Runtime("the client's runtime is gone".into()));
        };
        runtime.spawn(work).await.map_err(|e| {
            SharedError::Runtime(format!("a request to the shared store failed: {e}"))
        })?
    }

    /// Whether the bucket holds `digest`.
    pub async fn has(&self, digest: &Digest) -> Result<bool, SharedError> {
        let (me, key) = (self.clone(), self.key(digest));
        self.run(async move {
            match me.0.bucket.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(source) => Err(me.failed("look for", &key, source)),
            }
        })
        .await
    }

    /// Puts the local blob `digest` of `store` in the bucket (unless it is
    /// there already); answers whether it was sent.
    pub async fn put(&self, store: &Store, digest: &Digest) -> Result<bool, SharedError> {
        if self.has(digest).await? {
            return Ok(false);
        }
        let (me, key, path) = (self.clone(), self.key(digest), store.path(digest));
        self.run(async move {
            let file = tokio::fs::File::open(&path)
                .await
                .map_err(|source| SharedError::Local {
                    path: path.clone(),
                    source,
                })?;
            let size = file
                .metadata()
                .await
                .map_err(|source| SharedError::Local {
                    path: path.clone(),
                    source,
                })?
                .len();
            if size <= PART_BYTES as u64 {
                let bytes = tokio::fs::read(&path)
                    .await
                    .map_err(|source| SharedError::Local {
                        path: path.clone(),
                        source,
                    })?;
                me.0.bucket
                    .put(&key, bytes.into())
                    .await
                    .map_err(|source| me.failed("put", &key, source))?;
            } else {
                me.put_in_parts(&key, file, &path).await?;
            }
            Ok(true)
        })
        .await
    }

    /// A large blob, sent part by part (never whole in memory).
    async fn put_in_parts(
        &self,
        key: &Key,
        mut file: tokio::fs::File,
        path: &Path,
    ) -> Result<(), SharedError> {
        use tokio::io::AsyncReadExt;
        let mut upload = object_store::WriteMultipart::new_with_chunk_size(
            self.0
                .bucket
                .put_multipart(key)
                .await
                .map_err(|source| self.failed("start putting", key, source))?,
            PART_BYTES,
        );
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let read = file
                .read(&mut buf)
                .await
                .map_err(|source| SharedError::Local {
                    path: path.to_owned(),
                    source,
                })?;
            if read == 0 {
                break;
            }
            upload
                .wait_for_capacity(2)
                .await
                .map_err(|source| self.failed("put", key, source))?;
            upload.write(buf.get(..read).unwrap_or_default());
        }
        upload
            .finish()
            .await
            .map_err(|source| self.failed("finish putting", key, source))?;
        Ok(())
    }

    /// Fetches `digest` from the bucket into `store`, checking its digest
    /// as it lands; waits from any thread.
    pub fn fetch_blocking(&self, store: &Store, digest: &Digest) -> Result<(), SharedError> {
        let (me, store, digest) = (self.clone(), store.clone(), digest.clone());
        self.wait(async move { me.fetch(&store, &digest).await })
    }

    async fn fetch(&self, store: &Store, digest: &Digest) -> Result<(), SharedError> {
        let key = self.key(digest);
        let got = self
            .0
            .bucket
            .get(&key)
            .await
            .map_err(|source| match source {
                object_store::Error::NotFound { .. } => SharedError::Absent {
                    url: self.0.url.clone(),
                    digest: digest.clone(),
                },
                source => self.failed("fetch", &key, source),
            })?;
        // Held until the blob has its name, so gc cannot sweep the temp
        // file it fills. (Taken on a blocking thread: it may wait.)
        let locker = store.clone();
        let _lock = tokio::task::spawn_blocking(move || locker.shared_lock())
            .await
            .map_err(|e| SharedError::Runtime(e.to_string()))??;
        let mut writer = store.writer()?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| self.failed("fetch", &key, source))?;
            writer.append(&chunk)?;
        }
        let written = tokio::task::spawn_blocking(move || writer.finish())
            .await
            .map_err(|e| SharedError::Runtime(e.to_string()))??;
        if written.digest != *digest {
            return Err(SharedError::WrongBytes {
                url: self.0.url.clone(),
                digest: digest.clone(),
                found: written.digest,
            });
        }
        Ok(())
    }

    /// Every blob in the bucket.
    pub async fn list(&self) -> Result<Vec<SharedBlob>, SharedError> {
        let (me, prefix) = (self.clone(), self.blobs_prefix());
        self.run(async move {
            let mut blobs = Vec::new();
            let mut listing = me.0.bucket.list(Some(&prefix));
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|source| me.failed("list", &prefix, source))?;
                let Some(digest) = meta
                    .location
                    .filename()
                    .and_then(|name| Digest::parse(name).ok())
                else {
                    continue;
                };
                blobs.push(SharedBlob {
                    digest,
                    size: meta.size,
                    modified: meta.last_modified.into(),
                });
            }
            Ok(blobs)
        })
        .await
    }

    /// Deletes `digest` from the bucket (gone already is fine).
    pub async fn delete(&self, digest: &Digest) -> Result<(), SharedError> {
        let (me, key) = (self.clone(), self.key(digest));
        self.run(async move {
            match me.0.bucket.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(source) => Err(me.failed("delete", &key, source)),
            }
        })
        .await
    }

    fn failed(&self, what: &'static str, key: &Key, source: object_store::Error) -> SharedError {
        SharedError::Request {
            what,
            url: self.0.url.clone(),
            key: key.to_string(),
            reason: root_cause(&source),
        }
    }
}

/// The innermost cause of `error` ("Connection refused", the server's own
/// answer): the client's layers above it repeat the request's URL and
/// retry counts, which the error names once already.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Why the shared store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    /// `SILO_STORE_URL` is not a bucket's URL.
    #[error("SILO_STORE_URL {url:?} is not s3://BUCKET[/PREFIX]: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The client could not be set up from the URL and the `AWS_*` variables.
    #[error("cannot set up the S3 client for {url} (check the AWS_* variables)")]
    Config {
        /// The bucket's URL.
        url: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A request failed: the server did not answer, or refused.
    #[error("the shared store at {url} could not {what} {key}: {reason}")]
    Request {
        /// What was asked.
        what: &'static str,
        /// The bucket's URL.
        url: String,
        /// The object.
        key: String,
        /// Why, as the innermost error said it.
        reason: String,
    },
    /// A blob a recorded snapshot names is not in the bucket.
    #[error("blob {digest} is not in the shared store at {url}")]
    Absent {
        /// The bucket's URL.
        url: String,
        /// The blob.
        digest: Digest,
    },
    /// The bucket's blob does not hold the bytes its name says.
    #[error("the shared store at {url} holds other bytes under {digest} (their sha256 is {found})")]
    WrongBytes {
        /// The bucket's URL.
        url: String,
        /// The blob asked for.
        digest: Digest,
        /// What its bytes hash to.
        found: Digest,
    },
    /// A local blob could not be read to be sent.
    #[error("cannot read {} to put it in the shared store", path.display())]
    Local {
        /// The local file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The local store failed while a fetched blob was written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The client's runtime could not run the request.
    #[error("shared store client: {0}")]
    Runtime(String),
}
