//! SPDY/3 header blocks: the pairs' wire form (a count, then each name and
//! value with a 32-bit length), compressed as one zlib stream per
//! direction and connection with the protocol's preset dictionary.
//!
//! Inbound blocks are inflated into a window that starts with the
//! dictionary, so back-references into it resolve (miniz_oxide's raw
//! inflater writing into a caller-held buffer). Outbound blocks are zlib
//! *stored* blocks, each ended by an empty one as a sync flush ends it:
//! valid for any inflater, no back-references needed; the stream's header
//! still names the dictionary, as SPDY requires.

use std::sync::OnceLock;

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::inflate_flags::{
    TINFL_FLAG_HAS_MORE_INPUT, TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
};
use miniz_oxide::inflate::core::{DecompressorOxide, decompress};

/// The header names of SPDY/3's dictionary, each stored with its 32-bit length.
const DICTIONARY_NAMES: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail: status codes and common values, as one run.
const DICTIONARY_TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412\
413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved Permanently\
400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error\
501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec \
00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,\
application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=\
gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// Most bytes one inflated header block may have.
pub const MAX_HEADER_BLOCK: usize = 64 << 10;
/// How much inflated history back-references may reach (deflate's window).
const WINDOW: usize = 32 << 10;
/// The largest stored block.
const STORED_MAX: usize = 0xffff;

/// A header block that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    /// The zlib stream's header is wrong or names another dictionary.
    #[error("the header block's zlib header is invalid")]
    ZlibHeader,
    /// The compressed data is corrupt.
    #[error("the header block does not inflate")]
    Corrupt,
    /// The block is larger than [`MAX_HEADER_BLOCK`].
    #[error("the header block is larger than {MAX_HEADER_BLOCK} bytes")]
    TooLarge,
    /// The pairs' framing is wrong.
    #[error("the header block's pairs are malformed")]
    Malformed,
}

/// SPDY/3's zlib dictionary (1423 bytes).
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let mut bytes = Vec::with_capacity(1423);
        for name in DICTIONARY_NAMES {
            let len = u32::try_from(name.len()).unwrap_or_default();
            bytes.extend_from_slice(&len.to_be_bytes());
            bytes.extend_from_slice(name.as_bytes());
        }
        bytes.extend_from_slice(DICTIONARY_TAIL.as_bytes());
        bytes
    })
}

/// Adler-32 of `data`, as zlib names a dictionary.
pub fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for byte in chunk {
            a += u32::from(*byte);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// The inflating side of one connection's header stream.
pub struct Inflater {
    state: Box<DecompressorOxide>,
    /// The dictionary, then everything inflated so far (trimmed to the window).
    window: Vec<u8>,
    started: bool,
}

impl Default for Inflater {
    fn default() -> Self {
        Self {
            state: Box::default(),
            window: dictionary().to_vec(),
            started: false,
        }
    }
}

impl Inflater {
    /// Inflates the next header block of the stream.
    pub fn block(&mut self, mut input: &[u8]) -> Result<Vec<u8>, HeaderError> {
        if !self.started {
            let [cmf, flg, rest @ ..] = input else {
                return Err(HeaderError::ZlibHeader);
            };
            if cmf & 0x0f != 8 || (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 != 0 {
                return Err(HeaderError::ZlibHeader);
            }
            input = rest;
            if flg & 0x20 != 0 {
                let [a, b, c, d, rest @ ..] = input else {
                    return Err(HeaderError::ZlibHeader);
                };
                if u32::from_be_bytes([*a, *b, *c, *d]) != adler32(dictionary()) {
                    return Err(HeaderError::ZlibHeader);
                }
                input = rest;
            }
            self.started = true;
        }
        let start = self.window.len();
        let flags = TINFL_FLAG_HAS_MORE_INPUT | TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
        loop {
            let at = self.window.len();
            if at - start > MAX_HEADER_BLOCK {
                return Err(HeaderError::TooLarge);
            }
            self.window.resize(at + 4096, 0);
            let (status, read, written) =
                decompress(&mut self.state, input, &mut self.window, at, flags);
            self.window.truncate(at + written);
            input = &input[read..];
            match status {
                TINFLStatus::HasMoreOutput => {}
                TINFLStatus::NeedsMoreInput | TINFLStatus::Done if input.is_empty() => break,
                TINFLStatus::NeedsMoreInput if read > 0 || written > 0 => {}
                _ => return Err(HeaderError::Corrupt),
            }
        }
        let block = self.window[start..].to_vec();
        if self.window.len() > 2 * WINDOW {
            let cut = self.window.len() - WINDOW;
            self.window.drain(..cut);
        }
        Ok(block)
    }
}

/// The deflating side of one connection's header stream (stored blocks).
#[derive(Default)]
pub struct Deflater {
    started: bool,
}

impl Deflater {
    /// The next header block of the stream for `raw`.
    pub fn block(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.started {
            // CMF: deflate, 32 KiB window; FLG: the dictionary flag, with
            // the check bits that make the pair a multiple of 31.
            let cmf = 0x78u8;
            let flg = 0x20u8;
            let check = (u16::from(cmf) << 8 | u16::from(flg)) % 31;
            let flg = if check == 0 {
                flg
            } else {
                flg + u8::try_from(31 - check).unwrap_or(0)
            };
            out.extend_from_slice(&[cmf, flg]);
            out.extend_from_slice(&adler32(dictionary()).to_be_bytes());
            self.started = true;
        }
        for chunk in raw.chunks(STORED_MAX) {
            let len = u16::try_from(chunk.len()).unwrap_or(u16::MAX);
            out.push(0x00);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // An empty stored block ends each header block, as zlib's sync
        // flush does: Go's inflater hands out a stored block's bytes only
        // once it reaches the next block, and must not read past the frame.
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        out
    }
}

/// The wire form of header pairs (before compression).
pub fn encode_pairs(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    let count = u32::try_from(pairs.len()).unwrap_or_default();
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in pairs {
        for text in [name, value] {
            let len = u32::try_from(text.len()).unwrap_or_default();
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(text.as_bytes());
        }
    }
    out
}

/// Header pairs from their wire form (names as sent: SPDY's are lowercase).
pub fn decode_pairs(raw: &[u8]) -> Result<Vec<(String, String)>, HeaderError> {
    fn take<'a>(raw: &mut &'a [u8], n: usize) -> Result<&'a [u8], HeaderError> {
        if raw.len() < n {
            return Err(HeaderError::Malformed);
        }
        let (head, tail) = raw.split_at(n);
        *raw = tail;
        Ok(head)
    }
    fn length(raw: &mut &[u8]) -> Result<usize, HeaderError> {
        let bytes = take(raw, 4)?;
        let n = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        usize::try_from(n).map_err(|_| HeaderError::Malformed)
    }
    let mut rest = raw;
    let count = length(&mut rest)?;
    let mut pairs = Vec::new();
    for _ in 0..count {
        let n = length(&mut rest)?;
        let name = String::from_utf8_lossy(take(&mut rest, n)?).into_owned();
        let n = length(&mut rest)?;
        let value = String::from_utf8_lossy(take(&mut rest, n)?).into_owned();
        pairs.push((name, value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        let dictionary = dictionary();
        assert_eq!(dictionary.len(), 1423);
        let digest = sha2::Sha256::digest(dictionary);
        let text: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            text,
            "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
        );
        assert_eq!(adler32(dictionary), 0xe3c6_a7c2);
    }

    #[test]
    fn blocks_compressed_with_the_dictionary_inflate_in_sequence() {
        // Two SYN_STREAM header blocks as zlib (level 9, SPDY/3's
        // dictionary, a sync flush after each) writes them.
        let first = hex(
            "78f9e3c6a7c202253a48f95b044eea16061606409ab308125f99a074cc68004e892545a989b9d0c2863515141500000000ffff",
        );
        let second = hex("225333a8a44a04000000ffff");
        let mut inflater = Inflater::default();
        let pairs = decode_pairs(&inflater.block(&first).unwrap()).unwrap();
        assert_eq!(
            pairs,
            [
                ("port".to_owned(), "8080".to_owned()),
                ("requestid".to_owned(), "0".to_owned()),
                ("streamtype".to_owned(), "error".to_owned()),
            ]
        );
        let pairs = decode_pairs(&inflater.block(&second).unwrap()).unwrap();
        assert_eq!(pairs[2], ("streamtype".to_owned(), "data".to_owned()));
    }

    #[test]
    fn stored_blocks_round_trip() {
        let mut deflater = Deflater::default();
        let mut inflater = Inflater::default();
        let raw = encode_pairs(&[("streamtype", "data"), ("port", "80")]);
        let first = deflater.block(&raw);
        assert_eq!((u16::from(first[0]) << 8 | u16::from(first[1])) % 31, 0);
        assert_eq!(inflater.block(&first).unwrap(), raw);
        let empty = encode_pairs(&[]);
        assert_eq!(inflater.block(&deflater.block(&empty)).unwrap(), empty);
        assert_eq!(decode_pairs(&[0, 0, 0, 1, 0]), Err(HeaderError::Malformed));
        let mut fresh = Inflater::default();
        assert_eq!(fresh.block(&[0x78, 0x21]), Err(HeaderError::ZlibHeader));
    }
}
