//! A bounded window of an exec's most recent output, addressed by byte offset.
//!
//! Sequence numbers are byte offsets in the exec's combined output, so the
//! ring can answer "replay from offset N" exactly: it hands back the chunks
//! from N on (trimming a chunk N falls inside) and says how many bytes before
//! its oldest held byte were asked for but are gone.

use std::collections::VecDeque;

use bytes::Bytes;
use silo_protocol::exec::Channel;

/// One read's worth of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of `data[0]` in the exec's output.
    pub seq: u64,
    /// Stdout or stderr.
    pub channel: Channel,
    /// The bytes (shared with whoever is streaming them live).
    pub data: Bytes,
}

impl Chunk {
    /// Offset just past the chunk.
    pub fn end(&self) -> u64 {
        self.seq + self.data.len() as u64
    }
}

/// What a replay request gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Offset of the first replayed byte (where the live stream continues if nothing is held).
    pub next_seq: u64,
    /// Bytes between the requested offset and `next_seq` that the ring no longer holds.
    pub lost_bytes: u64,
    /// Held output from `next_seq` on.
    pub chunks: Vec<Chunk>,
}

/// The recent-output window of one exec.
#[derive(Debug)]
pub struct Ring {
    chunks: VecDeque<Chunk>,
    /// Bytes currently held; never above `capacity`.
    held: usize,
    capacity: usize,
    /// Offset of the next byte to be produced (total produced so far).
    end: u64,
}

impl Ring {
    /// An empty ring holding at most `capacity` bytes (0 keeps nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            held: 0,
            capacity,
            end: 0,
        }
    }

    /// Appends output, evicting the oldest chunks to stay within capacity.
    /// Returns the chunk's sequence number.
    pub fn push(&mut self, channel: Channel, data: Bytes) -> u64 {
        let seq = self.end;
        self.end += data.len() as u64;
        if data.is_empty() || self.capacity == 0 {
            return seq;
        }
        // A chunk larger than the whole ring keeps only its tail.
        let (seq_kept, data) = if data.len() > self.capacity {
            let skip = data.len() - self.capacity;
            (seq + skip as u64, data.slice(skip..))
        } else {
            (seq, data)
        };
        while self.held + data.len() > self.capacity {
            match self.chunks.pop_front() {
                Some(old) => self.held -= old.data.len(),
                None => break,
            }
        }
        self.held += data.len();
        self.chunks.push_back(Chunk {
            seq: seq_kept,
            channel,
            data,
        });
        seq
    }

    /// Total bytes produced so far; the next chunk's sequence number.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Offset of the oldest byte still held (`end` when nothing is).
    pub fn start(&self) -> u64 {
        self.chunks.front().map_or(self.end, |c| c.seq)
    }

    /// Output from `from_seq` on, as far as it is still held. An offset past
    /// the end is treated as the end: there is nothing to replay yet.
    pub fn replay(&self, from_seq: u64) -> Replay {
        let from = from_seq.min(self.end);
        let start = self.start();
        let (next_seq, lost_bytes) = if from < start {
            (start, start - from)
        } else {
            (from, 0)
        };
        let first = self.chunks.partition_point(|c| c.end() <= next_seq);
        let chunks = self
            .chunks
            .range(first..)
            .map(|c| {
                if c.seq < next_seq {
                    // Offsets are inside this chunk, so the difference fits in usize.
                    let skip = usize::try_from(next_seq - c.seq).unwrap_or(c.data.len());
                    Chunk {
                        seq: next_seq,
                        channel: c.channel,
                        data: c.data.slice(skip..),
                    }
                } else {
                    c.clone()
                }
            })
            .collect();
        Replay {
            next_seq,
            lost_bytes,
            chunks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_with(capacity: usize, parts: &[&'static str]) -> Ring {
        let mut ring = Ring::new(capacity);
        for (i, part) in parts.iter().enumerate() {
            let channel = if i % 2 == 0 {
                Channel::Stdout
            } else {
                Channel::Stderr
            };
            ring.push(channel, Bytes::from_static(part.as_bytes()));
        }
        ring
    }

    fn text(replay: &Replay) -> String {
        replay
            .chunks
            .iter()
            .map(|c| String::from_utf8_lossy(&c.data).into_owned())
            .collect()
    }

    #[test]
    fn sequence_numbers_are_byte_offsets_across_channels() {
        let mut ring = Ring::new(100);
        assert_eq!(ring.push(Channel::Stdout, Bytes::from_static(b"abc")), 0);
        assert_eq!(ring.push(Channel::Stderr, Bytes::from_static(b"de")), 3);
        assert_eq!(ring.push(Channel::Stdout, Bytes::new()), 5);
        assert_eq!(ring.end(), 5);
        let all = ring.replay(0);
        assert_eq!(all.chunks.len(), 2);
        assert_eq!(all.chunks[1].channel, Channel::Stderr);
        assert_eq!(all.chunks[1].seq, 3);
    }

    #[test]
    fn replay_from_any_offset_trims_the_partial_chunk() {
        let ring = ring_with(100, &["hello ", "world", "!"]);
        let r = ring.replay(8);
        assert_eq!((r.next_seq, r.lost_bytes), (8, 0));
        assert_eq!(text(&r), "rld!");
        assert_eq!(r.chunks[0].seq, 8);
        assert_eq!(r.chunks[0].channel, Channel::Stderr);
        assert_eq!(text(&ring.replay(6)), "world!");
        assert_eq!(ring.replay(6).chunks.len(), 2);
        let at_end = ring.replay(12);
        assert_eq!((at_end.next_seq, at_end.chunks.len()), (12, 0));
        let past_end = ring.replay(1000);
        assert_eq!((past_end.next_seq, past_end.lost_bytes), (12, 0));
    }

    #[test]
    fn eviction_keeps_the_newest_bytes_and_counts_what_was_lost() {
        let ring = ring_with(8, &["aaaa", "bbbb", "cccc"]);
        assert_eq!(ring.held(), 8);
        assert_eq!(ring.start(), 4);
        let r = ring.replay(1);
        assert_eq!((r.next_seq, r.lost_bytes), (4, 3));
        assert_eq!(text(&r), "bbbbcccc");
        let r = ring.replay(5);
        assert_eq!((r.next_seq, r.lost_bytes), (5, 0));
        assert_eq!(text(&r), "bbbcccc");
    }

    #[test]
    fn an_oversized_chunk_keeps_its_tail_and_a_zero_ring_keeps_nothing() {
        let ring = ring_with(4, &["0123456789"]);
        let r = ring.replay(0);
        assert_eq!((r.next_seq, r.lost_bytes), (6, 6));
        assert_eq!(text(&r), "6789");

        let ring = ring_with(0, &["abc", "def"]);
        let r = ring.replay(0);
        assert_eq!((r.next_seq, r.lost_bytes, r.chunks.len()), (6, 6, 0));
        assert_eq!(ring.held(), 0);
    }
}
