//! The reader chain every signed archive body goes through, whoever takes
//! its entries.
//!
//! [`read_archive`] reads the body once, as it arrives: the raw reader
//! hashes and counts what comes in (the body cap), for gzip the decoder
//! inflates and the inflate meter counts what came out (the decompression
//! ratio), and the tar reader splits entries ([`Members`]: whole names,
//! link targets and PAX records read exactly), up to the entry cap, for an
//! [`Unpack`]: the push tree (`extract`), a layer's staging
//! (`crate::layers`). The hash is compared to the signed one only at the
//! end, so whatever an [`Unpack`] wrote is untrusted until it returns `Ok`.
//! A cap hit inside the gzip or tar readers surfaces as a plain read error;
//! the [`Meter`] remembers which cap it was, so the answer names it.

use std::cell::Cell;
use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use silo_protocol::bundle::{BundleLimits, RATIO_FLOOR_BYTES};
use silo_protocol::members::{Member, Members};

use super::extract::ExtractError;

/// Compressed bytes read ahead from the body at a time.
const READ_BUFFER: usize = 256 * 1024;

/// How a body is packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// A gzip-compressed tar (push bundles).
    Gzip,
    /// A plain tar (file API tree uploads).
    Tar,
}

/// What takes a checked archive's entries, one at a time: the push tree
/// (`extract`), a layer's staging (`crate::layers`).
pub trait Unpack {
    /// Takes one entry (its name, link target and extras as its
    /// extensions gave them); errors reading its contents go through
    /// `meter`, so a cap hit mid-entry is answered as that cap.
    fn add<R: Read>(
        &mut self,
        entry: &mut Member<'_, R>,
        meter: &Meter,
    ) -> Result<(), ExtractError>;
}

/// Reads the archive in `body` once, through the hash, the body cap and
/// (for gzip) the ratio bound, handing every entry to `unpack` up to the
/// entry cap; then checks the body's SHA-256 against `claimed_sha256` and
/// answers it. Stops before the next entry once `cancelled` is set.
pub fn read_archive<R: Read>(
    packing: Packing,
    body: R,
    limits: &BundleLimits,
    claimed_sha256: &str,
    cancelled: &AtomicBool,
    unpack: &mut impl Unpack,
) -> Result<String, ExtractError> {
    let meter = Meter::default();
    let raw = RawReader {
        inner: body,
        hasher: Sha256::new(),
        meter: &meter,
        cap: limits.max_bundle_bytes,
    };
    let mut buffered = BufReader::with_capacity(READ_BUFFER, raw);
    match packing {
        Packing::Gzip => {
            let mut inflate = InflateReader {
                inner: flate2::bufread::GzDecoder::new(&mut buffered),
                meter: &meter,
                max_ratio: limits.max_ratio,
            };
            unpack_all(&mut inflate, unpack, limits, &meter, cancelled)?;
            // The tar's end marker may come before the gzip trailer (and its
            // CRC): read the rest, still metered, then nothing may follow
            // the gzip stream.
            io::copy(&mut inflate, &mut io::sink()).map_err(|e| meter.read_error(e))?;
            let trailing =
                io::copy(&mut buffered, &mut io::sink()).map_err(|e| meter.read_error(e))?;
            if trailing > 0 {
                return Err(ExtractError::TrailingData);
            }
        }
        Packing::Tar => {
            unpack_all(&mut buffered, unpack, limits, &meter, cancelled)?;
            // Tar writers pad past the end marker to a whole record; the
            // padding is part of what was signed, so it is read and hashed.
            io::copy(&mut buffered, &mut io::sink()).map_err(|e| meter.read_error(e))?;
        }
    }
    let sha256 = hex::encode(buffered.into_inner().hasher.finalize());
    if sha256 != claimed_sha256 {
        return Err(ExtractError::HashMismatch {
            claimed: claimed_sha256.to_owned(),
            actual: sha256,
        });
    }
    Ok(sha256)
}

/// Hands every entry of the tar read from `tar` to `unpack`.
fn unpack_all<R: Read>(
    tar: R,
    unpack: &mut impl Unpack,
    limits: &BundleLimits,
    meter: &Meter,
    cancelled: &AtomicBool,
) -> Result<(), ExtractError> {
    let mut archive = tar::Archive::new(tar);
    let mut entries = 0u64;
    for entry in Members::new(archive.entries().map_err(|e| meter.read_error(e))?) {
        if cancelled.load(Ordering::Relaxed) {
            return Err(ExtractError::Cancelled);
        }
        let mut entry = entry.map_err(|e| meter.read_error(e))?;
        entries += 1;
        if entries > limits.max_entries {
            return Err(ExtractError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        unpack.add(&mut entry, meter)?;
    }
    Ok(())
}

/// A cap hit while reading, remembered so the reader's plain `io::Error`
/// (which the gzip and tar layers pass on or wrap) maps to the right answer.
#[derive(Debug, Clone, Copy)]
enum Over {
    Bundle(u64),
    Ratio(u64),
}

/// What the readers counted, and the cap they hit if any.
#[derive(Default)]
pub struct Meter {
    compressed: Cell<u64>,
    inflated: Cell<u64>,
    over: Cell<Option<Over>>,
}

impl Meter {
    fn trip(&self, over: Over) -> io::Error {
        self.over.set(Some(over));
        io::Error::other("bundle limit reached")
    }

    /// The answer for a failed read: the cap that stopped it, or a malformed body.
    pub fn read_error(&self, source: io::Error) -> ExtractError {
        match self.over.get() {
            Some(Over::Bundle(limit)) => ExtractError::BundleTooLarge { limit },
            Some(Over::Ratio(ratio)) => ExtractError::Bomb { ratio },
            None => ExtractError::Malformed(source),
        }
    }
}

struct RawReader<'m, R> {
    inner: R,
    hasher: Sha256,
    meter: &'m Meter,
    cap: u64,
}

impl<R: Read> Read for RawReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        let total = self.meter.compressed.get() + n as u64;
        self.meter.compressed.set(total);
        if total > self.cap {
            return Err(self.meter.trip(Over::Bundle(self.cap)));
        }
        Ok(n)
    }
}

struct InflateReader<'m, R> {
    inner: R,
    meter: &'m Meter,
    max_ratio: u64,
}

impl<R: Read> Read for InflateReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let inflated = self.meter.inflated.get() + n as u64;
        self.meter.inflated.set(inflated);
        let allowed = self
            .meter
            .compressed
            .get()
            .saturating_mul(self.max_ratio)
            .max(RATIO_FLOOR_BYTES);
        if inflated > allowed {
            return Err(self.meter.trip(Over::Ratio(self.max_ratio)));
        }
        Ok(n)
    }
}
