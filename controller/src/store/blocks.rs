//! The block sums of a file a layer holds ([`silo_protocol::blocks`]),
//! read once and kept beside the store: an in-place rewind compares them
//! with the sums the agent sends of the live file, and patches only the
//! blocks that differ.
//!
//! Layout: `sums/<layer hex>/<offset of the file's data in the layer>`
//! holds the sums, then the SHA-256 of those bytes. They are derived from
//! a blob that never changes, so a file that is missing, torn or does not
//! check is read again from the layer and written anew (temp file, then
//! `rename`); removing a layer's blob removes its sums
//! ([`super::Store::remove`]).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use silo_protocol::blocks::{BLOCK_BYTES, BlockSums, SUM_BYTES, Sum};

use super::Digest;
use super::table::{DataError, Entry};

/// The directory of sums under the store's root.
pub(super) const SUMS_DIR: &str = "sums";

/// The block sums of `entry`'s data, a file of `layer` (`path` names it in
/// errors), from `root`'s cache or read from `blob` and cached.
pub fn of_entry(
    root: &Path,
    blob: &mut File,
    layer: &Digest,
    path: &[u8],
    entry: &Entry,
) -> Result<BlockSums, DataError> {
    let cached = cache_path(root, layer, entry);
    let blocks = usize::try_from(entry.size.div_ceil(BLOCK_BYTES)).unwrap_or(usize::MAX);
    if let Some(sums) = read_cached(&cached, blocks) {
        return Ok(sums);
    }
    let data = entry.data(&mut *blob, layer, path)?;
    let sums = BlockSums::read(data).map_err(|source| DataError::new(layer, path, source))?;
    if let Err(err) = write_cached(&cached, &sums) {
        // Only a cost: the next rewind reads the file again.
        tracing::debug!(path = %cached.display(), error = %err, "block sums not cached");
    }
    Ok(sums)
}

/// Removes the cached sums of `layer`'s files, if any.
pub(super) fn forget_layer(root: &Path, layer: &Digest) -> io::Result<()> {
    match fs::remove_dir_all(root.join(SUMS_DIR).join(layer.to_string())) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

fn cache_path(root: &Path, layer: &Digest, entry: &Entry) -> PathBuf {
    root.join(SUMS_DIR)
        .join(layer.to_string())
        .join(entry.data_at.to_string())
}

/// The cached sums, if the file holds `blocks` of them and its check.
fn read_cached(path: &Path, blocks: usize) -> Option<BlockSums> {
    let mut bytes = Vec::new();
    File::open(path).ok()?.read_to_end(&mut bytes).ok()?;
    let split = blocks.checked_mul(SUM_BYTES)?;
    if bytes.len() != split + 32 {
        return None;
    }
    let (sums, check) = bytes.split_at(split);
    if Sha256::digest(sums).as_slice() != check {
        return None;
    }
    let sums = sums
        .chunks(SUM_BYTES)
        .map(|chunk| Sum::try_from(chunk).ok())
        .collect::<Option<Vec<_>>>()?;
    Some(BlockSums(sums))
}

fn write_cached(path: &Path, sums: &BlockSums) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("no directory"))?;
    fs::create_dir_all(dir)?;
    let bytes: Vec<u8> = sums.0.iter().flatten().copied().collect();
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(&bytes)?;
    temp.write_all(&Sha256::digest(&bytes))?;
    temp.persist(path).map_err(|err| err.error)?;
    Ok(())
}
