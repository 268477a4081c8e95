//! SPDY/3.1 framing: an 8-byte header, then the payload. A control frame
//! has the top bit set, the version (3), its type, flags and a 24-bit
//! length; a data frame has the stream id, flags and a 24-bit length.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The protocol version.
pub const VERSION: u16 = 3;
/// Control frame types the server reads or writes.
pub const SYN_STREAM: u16 = 1;
/// Answers a stream.
pub const SYN_REPLY: u16 = 2;
/// Ends a stream abruptly.
pub const RST_STREAM: u16 = 3;
/// Round-trip check; answered with the same id.
pub const PING: u16 = 6;
/// Ends the session.
pub const GOAWAY: u16 = 7;
/// Flag: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// RST_STREAM status: the stream is not wanted.
pub const CANCEL: u32 = 5;
/// Largest frame the server takes (the format allows 16 MiB).
pub const MAX_FRAME: usize = 1 << 20;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A control frame.
    Control {
        /// Its type.
        kind: u16,
        /// Its flags.
        flags: u8,
        /// Its payload.
        payload: Bytes,
    },
    /// A data frame.
    Data {
        /// The stream.
        stream: u32,
        /// Its flags.
        flags: u8,
        /// Its bytes.
        payload: Bytes,
    },
}

/// A frame that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading failed or ended mid-frame.
    #[error("reading a frame failed")]
    Read(#[from] std::io::Error),
    /// A control frame of another SPDY version.
    #[error("spdy version {0} is not 3")]
    Version(u16),
    /// A frame larger than [`MAX_FRAME`].
    #[error("a frame of {0} bytes is larger than the server takes")]
    TooLarge(usize),
}

/// Reads the next frame; `None` when the connection ends between frames.
pub async fn read<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; 8];
    let first = reader.read(&mut head[..1]).await?;
    if first == 0 {
        return Ok(None);
    }
    reader.read_exact(&mut head[1..]).await?;
    let flags = head[4];
    let length = usize::from(head[5]) << 16 | usize::from(head[6]) << 8 | usize::from(head[7]);
    if length > MAX_FRAME {
        return Err(FrameError::TooLarge(length));
    }
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).await?;
    let payload = Bytes::from(payload);
    if head[0] & 0x80 != 0 {
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        Ok(Some(Frame::Control {
            kind,
            flags,
            payload,
        }))
    } else {
        let stream = u32::from_be_bytes([head[0] & 0x7f, head[1], head[2], head[3]]);
        Ok(Some(Frame::Data {
            stream,
            flags,
            payload,
        }))
    }
}

fn length_bytes(length: usize) -> [u8; 3] {
    let n = u32::try_from(length.min(0x00ff_ffff)).unwrap_or(0x00ff_ffff);
    let [_, a, b, c] = n.to_be_bytes();
    [a, b, c]
}

/// A control frame's bytes.
pub fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&length_bytes(payload.len()));
    out.extend_from_slice(payload);
    out
}

/// A data frame's bytes.
pub fn data(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&length_bytes(payload.len()));
    out.extend_from_slice(payload);
    out
}

/// The 31-bit stream id at the start of a control payload.
pub fn stream_id(payload: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = payload.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes) & 0x7fff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let mut wire = control(PING, 0, &7u32.to_be_bytes());
        wire.extend(data(3, FLAG_FIN, b"hello"));
        let mut reader = wire.as_slice();
        assert_eq!(
            read(&mut reader).await.unwrap(),
            Some(Frame::Control {
                kind: PING,
                flags: 0,
                payload: Bytes::from_static(&[0, 0, 0, 7]),
            })
        );
        assert_eq!(
            read(&mut reader).await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                flags: FLAG_FIN,
                payload: Bytes::from_static(b"hello"),
            })
        );
        assert_eq!(read(&mut reader).await.unwrap(), None);
        let mut other = control(PING, 0, &[0; 4]);
        other[1] = 2;
        assert!(matches!(
            read(&mut other.as_slice()).await,
            Err(FrameError::Version(2))
        ));
    }
}
