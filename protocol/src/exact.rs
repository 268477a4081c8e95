//! [`ExactReader`]: the contents of one tar entry whose header already
//! holds its size.
//!
//! Every tar silo writes (push bundles, snapshot layers, the image archives
//! it hands the engine) streams a file after a header that declared the
//! file's length. A file that shrinks meanwhile must fail the archive
//! rather than leave an entry shorter than its header says (which shifts
//! every entry after it); bytes beyond the declared length are not read.

use std::io::{self, Read};

/// Yields exactly `len` bytes of `inner`, or an `UnexpectedEof` error.
#[derive(Debug)]
pub struct ExactReader<R> {
    inner: R,
    left: u64,
}

impl<R> ExactReader<R> {
    /// Reads `len` bytes of `inner`.
    pub fn new(inner: R, len: u64) -> Self {
        Self { inner, left: len }
    }
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("shrank while it was read ({} bytes short)", self.left),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_short_read_is_an_error_and_a_long_one_is_cut() {
        let mut out = Vec::new();
        let short = ExactReader::new(&b"abc"[..], 5).read_to_end(&mut out);
        assert_eq!(short.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);

        let mut out = Vec::new();
        ExactReader::new(&b"abcdef"[..], 4)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"abcd");
    }
}
