//! Block sums and patches (protocol 10, [`crate::Feature::BlockRewind`]):
//! an in-place rewind that puts back only the blocks of a changed file
//! that differ from the snapshot's.
//!
//! A file is cut into blocks of [`BLOCK_BYTES`] from its start (the last
//! one may be shorter) and each block is named by the first
//! [`SUM_BYTES`] of its SHA-256: its [`BlockSums`]. A rewind request may
//! ask for them (`block_sums`); the agent then follows the change list's
//! record of every changed regular file of at least [`MIN_SUMMED_BYTES`]
//! with one name by a record of that file's sums, as it is now
//! ([`crate::rewind`]). The controller compares them with the sums of the
//! file the snapshot holds and sends a [`Patch`] instead of the whole
//! file: the blocks that differ, and the size.
//!
//! Exactness rests on SHA-256 alone: a block is kept only where its sum
//! is the snapshot's, and a block cut short or missing never matches a
//! whole one. Blocks are whole pages, so a run of zeros the patch writes
//! can go back as a hole, as a whole file's would.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

/// Size of a block, a multiple of the page.
pub const BLOCK_BYTES: u64 = 16 * 1024;
/// Bytes of a block's sum: the first 128 bits of its SHA-256.
pub const SUM_BYTES: usize = 16;
/// The smallest file whose blocks are summed: below this, a file goes
/// back whole for about what its sums would cost.
pub const MIN_SUMMED_BYTES: u64 = 256 * 1024;
/// The PAX key of an entry that is a [`Patch`] on the file at its path.
pub const PAX_PATCH: &str = "SILO.patch";

/// One block's sum.
pub type Sum = [u8; SUM_BYTES];

/// The sums of a file's blocks, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockSums(pub Vec<Sum>);

impl BlockSums {
    /// Reads `reader` to its end, summing each block: a few megabytes
    /// read at a time, their blocks summed on up to [`MAX_SUM_THREADS`]
    /// threads (SHA-256 is slower than a read from the page cache).
    pub fn read(mut reader: impl Read) -> io::Result<Self> {
        let mut buf = vec![0u8; READ_BYTES];
        let mut sums = Vec::new();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_SUM_THREADS);
        loop {
            let n = fill(&mut reader, &mut buf)?;
            sum_blocks(&buf[..n], threads, &mut sums)?;
            if n < buf.len() {
                return Ok(Self(sums));
            }
        }
    }

    /// The sums as lowercase hex, as the change list carries them.
    pub fn to_hex(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() * SUM_BYTES * 2);
        for sum in &self.0 {
            out.extend_from_slice(hex::encode(sum).as_bytes());
        }
        out
    }

    /// Sums read back from [`BlockSums::to_hex`]; `None` if it is not that.
    pub fn from_hex(text: &[u8]) -> Option<Self> {
        if text.len() % (SUM_BYTES * 2) != 0 {
            return None;
        }
        text.chunks(SUM_BYTES * 2)
            .map(|chunk| {
                let mut sum = [0u8; SUM_BYTES];
                hex::decode_to_slice(chunk, &mut sum).ok()?;
                Some(sum)
            })
            .collect::<Option<Vec<_>>>()
            .map(Self)
    }

    /// The blocks of a file with these sums that are not those of a file
    /// of `size` bytes with the sums `target`: the runs, as byte ranges cut
    /// to `size`, that must be written for this file to become that one
    /// (after which it is cut to `size`).
    pub fn differing(&self, target: &BlockSums, size: u64) -> Vec<Range> {
        let mut ranges: Vec<Range> = Vec::new();
        for (i, want) in target.0.iter().enumerate() {
            if self.0.get(i) == Some(want) {
                continue;
            }
            let at = i as u64 * BLOCK_BYTES;
            let len = BLOCK_BYTES.min(size.saturating_sub(at));
            match ranges.last_mut() {
                Some(last) if last.at + last.len == at => last.len += len,
                _ => ranges.push(Range { at, len }),
            }
        }
        ranges
    }
}

/// Bytes read at a time by [`BlockSums::read`]: whole blocks.
const READ_BYTES: usize = 256 * BLOCK_BYTES as usize;
/// Most threads that sum one read's blocks.
pub const MAX_SUM_THREADS: usize = 4;
/// Fewest blocks worth a thread of their own.
const BLOCKS_PER_THREAD: usize = 16;

/// Appends the sums of `data`'s blocks to `out`, on up to `threads`
/// threads (a thread that cannot be made leaves its share to this one).
fn sum_blocks(data: &[u8], threads: usize, out: &mut Vec<Sum>) -> io::Result<()> {
    let block = usize::try_from(BLOCK_BYTES).unwrap_or(usize::MAX);
    let blocks: Vec<&[u8]> = data.chunks(block).collect();
    let threads = threads.min(blocks.len() / BLOCKS_PER_THREAD).max(1);
    let per = blocks.len().div_ceil(threads).max(1);
    let sum_all = |part: &[&[u8]]| part.iter().map(|b| sum(b)).collect::<Vec<Sum>>();
    std::thread::scope(|scope| {
        let mut parts = blocks.chunks(per);
        let first = parts.next().unwrap_or_default();
        let spawned: Vec<_> = parts
            .map(|part| {
                let handle = std::thread::Builder::new()
                    .name("block-sums".into())
                    .spawn_scoped(scope, move || sum_all(part));
                (part, handle)
            })
            .collect();
        out.extend(sum_all(first));
        for (part, handle) in spawned {
            match handle {
                Ok(handle) => out.extend(
                    handle
                        .join()
                        .map_err(|_| io::Error::other("a thread summing blocks failed"))?,
                ),
                Err(_) => out.extend(sum_all(part)),
            }
        }
        Ok(())
    })
}

/// The sum of one block.
pub fn sum(block: &[u8]) -> Sum {
    let digest = Sha256::digest(block);
    let mut out = [0u8; SUM_BYTES];
    out.copy_from_slice(&digest[..SUM_BYTES]);
    out
}

/// Bytes of a file from `at`, `len` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Where it starts.
    pub at: u64,
    /// How long it is.
    pub len: u64,
}

/// A change to the file at an entry's path instead of the whole file: the
/// entry's data is the bytes of `ranges`, one after another, written at
/// their offsets; then the file is cut (or grown, with a hole) to `size`,
/// and takes the entry's owner, mode, time and attributes. The file must
/// be a regular file with one name; a patch is only ever the last step of
/// making it the snapshot's, so writing it twice gives the same file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    /// The file's size afterwards.
    pub size: u64,
    /// What is written, in file order, none overlapping.
    pub ranges: Vec<Range>,
}

impl Patch {
    /// Bytes of data the entry carries.
    pub fn data_len(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// The PAX value: `SIZE` then ` AT+LEN` for each range.
    pub fn to_pax(&self) -> String {
        let mut out = self.size.to_string();
        for range in &self.ranges {
            out.push_str(&format!(" {}+{}", range.at, range.len));
        }
        out
    }

    /// A patch read back from its PAX value; `None` if it is not one (ranges
    /// out of order, overlapping, empty or past `size`).
    pub fn from_pax(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split(' ');
        let size: u64 = parts.next()?.parse().ok()?;
        let mut ranges = Vec::new();
        let mut end = 0u64;
        for part in parts {
            let (at, len) = part.split_once('+')?;
            let (at, len): (u64, u64) = (at.parse().ok()?, len.parse().ok()?);
            let stop = at.checked_add(len)?;
            if len == 0 || at < end || stop > size {
                return None;
            }
            end = stop;
            ranges.push(Range { at, len });
        }
        Some(Self { size, ranges })
    }
}

/// Reads into `buf` until it is full or `reader` ends; how many bytes
/// (fewer than `buf` holds only at the end).
pub fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn file(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    #[test]
    fn only_blocks_that_differ_are_named_and_cut_to_the_target_size() {
        let block = BLOCK_BYTES as usize;
        let target = file(5 * block + 100, 0);
        let target_sums = BlockSums::read(&target[..]).unwrap();
        assert_eq!(target_sums.0.len(), 6);
        // Two middle blocks changed, and a tail appended.
        let mut live = target.clone();
        live[block + 3] ^= 1;
        live[2 * block] ^= 1;
        live.extend_from_slice(&[7; 5000]);
        let live_sums = BlockSums::read(&live[..]).unwrap();
        let size = target.len() as u64;
        assert_eq!(
            live_sums.differing(&target_sums, size),
            [
                Range {
                    at: BLOCK_BYTES,
                    len: 2 * BLOCK_BYTES
                },
                Range {
                    at: 5 * BLOCK_BYTES,
                    len: 100
                },
            ]
        );
        // A file cut short differs in the block it was cut in and each
        // one after it.
        let short = &target[..3 * block + 1];
        let short_sums = BlockSums::read(short).unwrap();
        assert_eq!(
            short_sums.differing(&target_sums, size),
            [Range {
                at: 3 * BLOCK_BYTES,
                len: 2 * BLOCK_BYTES + 100
            }]
        );
        // The same file: nothing to write.
        assert!(target_sums.differing(&target_sums, size).is_empty());
        // An empty file has no blocks.
        assert!(BlockSums::read(&[][..]).unwrap().0.is_empty());
    }

    #[test]
    fn a_file_of_many_reads_has_its_blocks_sums_in_order() {
        // Over two reads' worth, summed on several threads, with a short
        // tail block.
        let data = file(2 * READ_BYTES + 3 * BLOCK_BYTES as usize + 77, 9);
        let one_by_one: Vec<Sum> = data.chunks(BLOCK_BYTES as usize).map(sum).collect();
        assert_eq!(BlockSums::read(&data[..]).unwrap().0, one_by_one);
        let mut alone = Vec::new();
        sum_blocks(&data, 1, &mut alone).unwrap();
        assert_eq!(alone, one_by_one);
    }

    #[test]
    fn sums_and_patches_round_trip_and_bad_ones_are_refused() {
        let sums = BlockSums::read(&file(40_000, 3)[..]).unwrap();
        assert_eq!(BlockSums::from_hex(&sums.to_hex()), Some(sums));
        assert_eq!(BlockSums::from_hex(b"abc"), None);
        assert_eq!(BlockSums::from_hex(&[b'z'; 32]), None);
        let patch = Patch {
            size: 100,
            ranges: vec![Range { at: 0, len: 10 }, Range { at: 50, len: 50 }],
        };
        assert_eq!(patch.to_pax(), "100 0+10 50+50");
        assert_eq!(Patch::from_pax(patch.to_pax().as_bytes()), Some(patch));
        assert_eq!(
            Patch::from_pax(b"7"),
            Some(Patch {
                size: 7,
                ranges: vec![]
            })
        );
        for bad in [
            &b""[..],
            b"x",
            b"10 0+11",
            b"10 5+2 4+1",
            b"10 0+0",
            b"10 1-2",
            b"10 18446744073709551615+2",
        ] {
            assert_eq!(
                Patch::from_pax(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
