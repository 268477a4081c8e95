//! Writing an image import for the engine (`docker load`,
//! `POST /images/load`) from the store, in the legacy layout every engine
//! reads: `<config hex>.json`, then `<layer hex>/layer.tar` for each
//! included layer (streamed from its blob, re-hashed on the way), then
//! `manifest.json` naming the config, the tag and *every* layer.
//!
//! A layer may be left out ([`LoadPlan::include`]) when the engine already
//! has it: the engine loads layers bottom up and skips one whose chain
//! (that layer on top of all those below it) it has, without opening its
//! file. So a left-out layer must be one whose whole chain is on the
//! engine; in practice, a prefix of the layers.
//!
//! The archive is deterministic (mtime 0, owner 0, fixed modes). If writing
//! fails part-way, nothing more reaches `out`, not even the tar's end
//! marker, so the engine sees a cut-short stream rather than a
//! well-formed archive missing its manifest.

use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};
use silo_protocol::exact::ExactReader;

use super::{Digest, Store, StoreError};

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    /// The image config, byte for byte (its hash is the image id).
    pub config_bytes: Vec<u8>,
    /// Every layer, bottom first; must equal the config's `rootfs.diff_ids`.
    pub layers: Vec<Digest>,
    /// Per layer, whether its file goes into the archive; `false` only for
    /// layers the engine has with their whole chain.
    pub include: Vec<bool>,
    /// The tag to give the image (`name:tag`), if any.
    pub repo_tag: Option<String>,
}

/// Why an import archive could not be written.
#[derive(Debug, thiserror::Error)]
pub enum LoadArchiveError {
    /// `include` does not have one flag per layer.
    #[error("load plan has {layers} layers but {include} include flags")]
    IncludeCount {
        /// Layers.
        layers: usize,
        /// Flags.
        include: usize,
    },
    /// The config is not JSON with `rootfs.diff_ids`.
    #[error("load plan's image config has no valid rootfs.diff_ids")]
    Config,
    /// The config's diff ids are not the plan's layers.
    #[error("load plan's layers do not match its image config's rootfs.diff_ids")]
    LayersMismatch,
    /// The store failed (a layer is missing, unreadable).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A layer's blob does not hash to its name.
    #[error("blob {digest} in the store is corrupt (it hashes to {actual})")]
    CorruptBlob {
        /// The blob.
        digest: Digest,
        /// What its bytes hash to.
        actual: Digest,
    },
    /// Writing the archive failed.
    #[error("cannot write the image import archive ({what})")]
    Write {
        /// The entry being written.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The engine's id of the image with this config: `sha256:<hex>`.
pub fn image_id(config_bytes: &[u8]) -> String {
    Digest::of(config_bytes).prefixed()
}

/// Writes the import archive of `plan` to `out`; returns its length.
pub fn write(out: impl Write, plan: &LoadPlan, store: &Store) -> Result<u64, LoadArchiveError> {
    check(plan)?;
    let mut builder = tar::Builder::new(Guarded {
        inner: out,
        written: 0,
        poisoned: false,
    });
    match write_entries(&mut builder, plan, store) {
        Ok(()) => {
            let out = builder
                .into_inner()
                .and_then(|mut out| out.flush().map(|()| out))
                .map_err(|source| LoadArchiveError::Write {
                    what: "end of archive".into(),
                    source,
                })?;
            Ok(out.written)
        }
        Err(error) => {
            // Dropping the builder appends the end marker; keep it from `out`.
            builder.get_mut().poisoned = true;
            Err(error)
        }
    }
}

/// The plan's shape, and its layers against its config.
fn check(plan: &LoadPlan) -> Result<(), LoadArchiveError> {
    if plan.include.len() != plan.layers.len() {
        return Err(LoadArchiveError::IncludeCount {
            layers: plan.layers.len(),
            include: plan.include.len(),
        });
    }
    let config: serde_json::Value =
        serde_json::from_slice(&plan.config_bytes).map_err(|_| LoadArchiveError::Config)?;
    let diff_ids = config
        .get("rootfs")
        .and_then(|r| r.get("diff_ids"))
        .and_then(|d| d.as_array())
        .ok_or(LoadArchiveError::Config)?;
    let matches = diff_ids.len() == plan.layers.len()
        && diff_ids
            .iter()
            .zip(&plan.layers)
            .all(|(id, layer)| id.as_str() == Some(layer.prefixed().as_str()));
    if matches {
        Ok(())
    } else {
        Err(LoadArchiveError::LayersMismatch)
    }
}

fn write_entries<W: Write>(
    builder: &mut tar::Builder<W>,
    plan: &LoadPlan,
    store: &Store,
) -> Result<(), LoadArchiveError> {
    let config_name = format!("{}.json", Digest::of(&plan.config_bytes));
    append(
        builder,
        &config_name,
        &plan.config_bytes[..],
        plan.config_bytes.len() as u64,
    )?;

    let layer_names: Vec<String> = plan
        .layers
        .iter()
        .map(|layer| format!("{layer}/layer.tar"))
        .collect();
    let mut written = std::collections::HashSet::new();
    for ((layer, name), include) in plan.layers.iter().zip(&layer_names).zip(&plan.include) {
        // A layer listed twice (two identical layers) is one file.
        if *include && written.insert(layer) {
            append_dir(builder, layer.as_str())?;
            append_layer(builder, name, layer, store)?;
        }
    }

    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": plan.repo_tag.as_ref().map(|tag| vec![tag]),
        "Layers": layer_names,
    }]);
    let manifest = serde_json::to_vec(&manifest).map_err(|e| LoadArchiveError::Write {
        what: "manifest.json".into(),
        source: e.into(),
    })?;
    append(
        builder,
        "manifest.json",
        &manifest[..],
        manifest.len() as u64,
    )
}

/// Streams a layer's blob as `name`, checking its size and hash on the way.
fn append_layer<W: Write>(
    builder: &mut tar::Builder<W>,
    name: &str,
    layer: &Digest,
    store: &Store,
) -> Result<(), LoadArchiveError> {
    let size = store.size(layer)?;
    // Exactly its size: a blob shorter than that must not make a short entry.
    let mut reader = Hashing {
        inner: ExactReader::new(store.open_blob(layer)?, size),
        hasher: Sha256::new(),
    };
    append(builder, name, &mut reader, size)?;
    let actual = Digest::from_hasher(reader.hasher);
    if actual != *layer {
        return Err(LoadArchiveError::CorruptBlob {
            digest: layer.clone(),
            actual,
        });
    }
    Ok(())
}

fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    name: &str,
    data: impl Read,
    size: u64,
) -> Result<(), LoadArchiveError> {
    let mut header = header(tar::EntryType::Regular, 0o644, size);
    builder
        .append_data(&mut header, name, data)
        .map_err(|source| LoadArchiveError::Write {
            what: name.into(),
            source,
        })
}

fn append_dir<W: Write>(builder: &mut tar::Builder<W>, name: &str) -> Result<(), LoadArchiveError> {
    let mut header = header(tar::EntryType::Directory, 0o755, 0);
    builder
        .append_data(&mut header, format!("{name}/"), io::empty())
        .map_err(|source| LoadArchiveError::Write {
            what: name.into(),
            source,
        })
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Hashes what is read through it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The caller's writer, counting bytes, and shut once poisoned.
struct Guarded<W> {
    inner: W,
    written: u64,
    poisoned: bool,
}

impl<W: Write> Write for Guarded<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.poisoned {
            return Err(io::Error::other("archive abandoned after an error"));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.poisoned {
            return Ok(());
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
