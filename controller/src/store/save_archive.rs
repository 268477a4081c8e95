//! Reading the engine's image export (`docker save`,
//! `GET /images/{name}/get`) into the store, in one pass over the stream.
//!
//! Every layout seen is read: the legacy one (`<id>/layer.tar`,
//! `<config hex>.json`), the OCI one (`blobs/sha256/<hex>`, where
//! `<id>/layer.tar` may be a link to a blob) and Podman's (`<diff id
//! hex>.tar` at the top, `<id>/layer.tar` linking to it). Either way
//! `manifest.json` names the config and the layers, and it usually comes
//! last, so nothing can wait for it: every entry named `….tar` or under `blobs/` goes
//! into the store as it streams by, and through a tee the same bytes feed a
//! tar parser that reads the layer's headers into a [`LayerDelta`]. Entries
//! that are not tars (OCI configs and manifests) are stored all the same.
//! Links are remembered as names, and other entries of at most
//! [`MAX_SMALL_ENTRY`] bytes are kept in memory. Once the stream ends, the
//! manifest resolves the config and the layers, each layer's digest must
//! equal the config's diff id at its position, and the deltas are applied in
//! order into the image's [`Index`].
//!
//! Blobs stored by an ingest that then fails (or that are not layers) stay
//! in the store unrecorded, for garbage collection: the caller holds the
//! store's shared lock across the ingest and the recording of its layers.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::sync::Arc;

use serde::Deserialize;

use super::{BlobTee, Digest, Index, IndexError, LayerDelta, Store, StoreError};

/// The largest entry kept in memory (the manifest, a legacy config).
pub const MAX_SMALL_ENTRY: u64 = 4 << 20;
/// The most bytes of small entries kept in memory together.
pub const MAX_SMALL_TOTAL: u64 = 64 << 20;
/// The longest chain of links followed from a manifest name.
const MAX_LINK_HOPS: usize = 16;
/// The first bytes of a gzip stream: a layer the engine exported compressed.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// An image read from an export.
#[derive(Debug, Clone)]
pub struct SavedImage {
    /// The image config, parsed.
    pub config: serde_json::Value,
    /// The config's exact bytes: the image id is their hash, so a load
    /// archive must carry these, not a re-serialization of `config`.
    pub config_bytes: Vec<u8>,
    /// The layers' digests (their diff ids), bottom first; each is in the
    /// store.
    pub layers: Vec<Digest>,
    /// The tags the manifest lists (empty for an untagged export).
    pub repo_tags: Vec<String>,
    /// The paths of the image's file system, all layers applied.
    pub index: Index,
    /// Bytes of blobs this ingest added to the store (blobs it already had
    /// are not counted).
    pub bytes_stored: u64,
}

/// Why an export could not be ingested.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The export stream is not a readable tar.
    #[error("cannot read the image export")]
    Read(#[source] io::Error),
    /// An entry ended before its header's size.
    #[error("image export entry {name:?} is cut short ({got} of {want} bytes)")]
    Truncated {
        /// The entry.
        name: String,
        /// Bytes read.
        got: u64,
        /// Bytes announced.
        want: u64,
    },
    /// Writing an entry into the store failed.
    #[error("cannot store image export entry {name:?}")]
    WriteBlob {
        /// The entry.
        name: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The blob store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An OCI blob's bytes do not hash to its name.
    #[error("image export entry {name:?} does not match its digest (it hashes to {actual})")]
    BlobDigestMismatch {
        /// The entry.
        name: String,
        /// What its bytes hash to.
        actual: Digest,
    },
    /// An entry needed as metadata (the manifest, the config) is larger
    /// than [`MAX_SMALL_ENTRY`].
    #[error("image export entry {name:?} is over {MAX_SMALL_ENTRY} bytes, too large for metadata")]
    TooLarge {
        /// The entry.
        name: String,
    },
    /// Small entries together exceed [`MAX_SMALL_TOTAL`].
    #[error("image export has more than {MAX_SMALL_TOTAL} bytes of metadata entries")]
    TooMuchMetadata,
    /// The manifest names an entry the export does not have.
    #[error("image export has no entry {name:?} (named by its manifest)")]
    Missing {
        /// The name.
        name: String,
    },
    /// Links that never reach an entry.
    #[error("image export link {name:?} loops or is more than {MAX_LINK_HOPS} links deep")]
    LinkLoop {
        /// The first name.
        name: String,
    },
    /// `manifest.json` is not the expected JSON.
    #[error("image export manifest.json is malformed")]
    Manifest(#[source] serde_json::Error),
    /// The export holds no image or several.
    #[error("image export holds {count} images; exactly one is expected")]
    ImageCount {
        /// How many the manifest lists.
        count: usize,
    },
    /// The config is not JSON.
    #[error("image config {name:?} is not JSON")]
    Config {
        /// The entry.
        name: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The config lacks a valid `rootfs.diff_ids`.
    #[error("image config {name:?} has no valid rootfs.diff_ids")]
    DiffIds {
        /// The entry.
        name: String,
    },
    /// The manifest and the config disagree on how many layers there are.
    #[error("image manifest lists {manifest} layers but its config has {config} diff ids")]
    LayerCount {
        /// Layers in the manifest.
        manifest: usize,
        /// Diff ids in the config.
        config: usize,
    },
    /// A layer's bytes do not hash to the config's diff id.
    #[error("layer {position} ({name:?}) hashes to {actual}, but the image config says {expected}")]
    DiffIdMismatch {
        /// Its position, bottom layer 0.
        position: usize,
        /// Its entry.
        name: String,
        /// The diff id in the config.
        expected: Digest,
        /// What it hashes to.
        actual: Digest,
    },
    /// A gzip layer (only uncompressed layers are read).
    #[error("layer {name:?} is gzip-compressed; compressed layers are not supported yet")]
    CompressedLayer {
        /// Its entry.
        name: String,
    },
    /// A layer that is not a tar.
    #[error("layer {name:?} is not a readable tar")]
    NotALayer {
        /// Its entry.
        name: String,
        /// Why.
        #[source]
        source: Arc<IndexError>,
    },
}

/// Reads an export from `reader` into `store`. Hold the store's shared lock
/// from before this call until its layers are recorded.
pub fn ingest(reader: impl Read, store: &Store) -> Result<SavedImage, IngestError> {
    let export = read_entries(reader, store)?;
    let manifest = export.manifest()?;
    let config_name = export.resolve(&manifest.config)?;
    let config_bytes = export.bytes_of(&config_name, store)?;
    let config: serde_json::Value =
        serde_json::from_slice(&config_bytes).map_err(|source| IngestError::Config {
            name: config_name.clone(),
            source,
        })?;
    let diff_ids = diff_ids(&config).ok_or(IngestError::DiffIds { name: config_name })?;
    if diff_ids.len() != manifest.layers.len() {
        return Err(IngestError::LayerCount {
            manifest: manifest.layers.len(),
            config: diff_ids.len(),
        });
    }
    let mut index = Index::new();
    let mut layers = Vec::with_capacity(diff_ids.len());
    for (position, (listed, expected)) in manifest.layers.iter().zip(diff_ids).enumerate() {
        let name = export.resolve(listed)?;
        let Some(blob) = export.stored.get(&name) else {
            return Err(IngestError::Missing { name });
        };
        if blob.gzip {
            return Err(IngestError::CompressedLayer { name });
        }
        if blob.digest != expected {
            return Err(IngestError::DiffIdMismatch {
                position,
                name,
                expected,
                actual: blob.digest.clone(),
            });
        }
        match &blob.delta {
            Ok(delta) => index.apply(delta),
            Err(source) => {
                return Err(IngestError::NotALayer {
                    name,
                    source: Arc::clone(source),
                });
            }
        }
        layers.push(expected);
    }
    Ok(SavedImage {
        config,
        config_bytes,
        layers,
        repo_tags: manifest.repo_tags.unwrap_or_default(),
        index,
        bytes_stored: export.bytes_stored,
    })
}

/// One image of `manifest.json`.
#[derive(Debug, Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// An entry that went into the store.
struct StoredEntry {
    digest: Digest,
    /// Its headers as a layer, or why it is not a tar.
    delta: Result<LayerDelta, Arc<IndexError>>,
    /// Whether it starts with the gzip magic.
    gzip: bool,
}

/// What the stream held, by normalized entry name.
#[derive(Default)]
struct Export {
    stored: HashMap<String, StoredEntry>,
    small: HashMap<String, Vec<u8>>,
    /// Symlinks and hard links: name → target name.
    links: HashMap<String, String>,
    /// Other entries too large to keep (named only to report them).
    large: HashSet<String>,
    small_total: u64,
    bytes_stored: u64,
}

fn read_entries(reader: impl Read, store: &Store) -> Result<Export, IngestError> {
    let mut export = Export::default();
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(IngestError::Read)? {
        let mut entry = entry.map_err(IngestError::Read)?;
        let name = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default();
            let target = if kind.is_symlink() && !target.starts_with('/') {
                let dir = name.rsplit_once('/').map_or("", |(dir, _)| dir);
                normalize(&format!("{dir}/{target}"))
            } else {
                normalize(&target)
            };
            export.links.insert(name, target);
        } else if !matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
            continue;
        } else if name.ends_with(".tar") || name.starts_with("blobs/") {
            let want = entry.size();
            let stored = store_entry(&mut entry, &name, want, store, &mut export)?;
            export.stored.insert(name, stored);
        } else if entry.size() <= MAX_SMALL_ENTRY {
            export.small_total += entry.size();
            if export.small_total > MAX_SMALL_TOTAL {
                return Err(IngestError::TooMuchMetadata);
            }
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut bytes).map_err(IngestError::Read)?;
            export.small.insert(name, bytes);
        } else {
            export.large.insert(name);
        }
    }
    Ok(export)
}

/// Streams one entry into a blob while parsing it as a layer.
fn store_entry(
    entry: &mut impl Read,
    name: &str,
    want: u64,
    store: &Store,
    export: &mut Export,
) -> Result<StoredEntry, IngestError> {
    let mut writer = store.writer()?;
    let head = Head {
        inner: entry,
        bytes: Vec::with_capacity(GZIP_MAGIC.len()),
    };
    let mut tee = BlobTee::new(head, &mut writer);
    let delta = LayerDelta::read(&mut tee).map_err(Arc::new);
    // Whatever the parser left (the tar's end padding, or all of a non-tar).
    let rest = io::copy(&mut tee, &mut io::sink());
    if let Some(source) = tee.write_error() {
        return Err(IngestError::WriteBlob {
            name: name.to_owned(),
            source,
        });
    }
    rest.map_err(IngestError::Read)?;
    let gzip = tee.inner().bytes == GZIP_MAGIC;
    if writer.size() != want {
        return Err(IngestError::Truncated {
            name: name.to_owned(),
            got: writer.size(),
            want,
        });
    }
    let written = writer.finish()?;
    if let Some(named) = name
        .strip_prefix("blobs/sha256/")
        .and_then(|hex| Digest::parse(hex).ok())
    {
        if named != written.digest {
            return Err(IngestError::BlobDigestMismatch {
                name: name.to_owned(),
                actual: written.digest,
            });
        }
    }
    if written.new {
        export.bytes_stored += written.size;
    }
    Ok(StoredEntry {
        digest: written.digest,
        delta,
        gzip,
    })
}

/// Remembers the first bytes read through it (the gzip magic test).
struct Head<R> {
    inner: R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Head<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let room = GZIP_MAGIC.len() - self.bytes.len();
        self.bytes.extend_from_slice(&buf[..n.min(room)]);
        Ok(n)
    }
}

impl Export {
    fn manifest(&self) -> Result<ManifestEntry, IngestError> {
        let name = "manifest.json";
        let Some(bytes) = self.small.get(name) else {
            return Err(self.absent(name));
        };
        let mut images: Vec<ManifestEntry> =
            serde_json::from_slice(bytes).map_err(IngestError::Manifest)?;
        match images.len() {
            1 => Ok(images.remove(0)),
            count => Err(IngestError::ImageCount { count }),
        }
    }

    /// Follows links from a manifest name to the entry that holds bytes.
    fn resolve(&self, listed: &str) -> Result<String, IngestError> {
        let mut name = normalize(listed);
        for _ in 0..MAX_LINK_HOPS {
            match self.links.get(&name) {
                Some(target) => name = target.clone(),
                None => return Ok(name),
            }
        }
        Err(IngestError::LinkLoop {
            name: listed.to_owned(),
        })
    }

    /// The bytes of a small entry, from memory or (OCI config blobs) the store.
    fn bytes_of(&self, name: &str, store: &Store) -> Result<Vec<u8>, IngestError> {
        if let Some(bytes) = self.small.get(name) {
            return Ok(bytes.clone());
        }
        let Some(blob) = self.stored.get(name) else {
            return Err(self.absent(name));
        };
        if store.size(&blob.digest)? > MAX_SMALL_ENTRY {
            return Err(IngestError::TooLarge { name: name.into() });
        }
        let path = store.path(&blob.digest);
        let mut bytes = Vec::new();
        store
            .open_blob(&blob.digest)?
            .read_to_end(&mut bytes)
            .map_err(|source| StoreError::Io {
                what: "read",
                path,
                source,
            })?;
        Ok(bytes)
    }

    /// Why a needed entry is not at hand.
    fn absent(&self, name: &str) -> IngestError {
        let name = name.to_owned();
        if self.large.contains(&name) {
            IngestError::TooLarge { name }
        } else {
            IngestError::Missing { name }
        }
    }
}

/// The config's `rootfs.diff_ids`, parsed.
fn diff_ids(config: &serde_json::Value) -> Option<Vec<Digest>> {
    config
        .get("rootfs")?
        .get("diff_ids")?
        .as_array()?
        .iter()
        .map(|id| Digest::parse_prefixed(id.as_str()?).ok())
        .collect()
}

/// An entry name without `./`, empty components or trailing slash, with
/// `..` applied (entry names are the engine's, not paths on the host).
fn normalize(name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

#[cfg(test)]
pub(super) mod tests;
