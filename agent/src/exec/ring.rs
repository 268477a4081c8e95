//! A bounded window of an exec's most recent output, addressed by byte offset.
//!
//! Sequence numbers are byte offsets in the exec's combined output, so the
//! ring can answer "replay from offset N" exactly: it hands back the output
//! from N on and says how many bytes before its oldest held byte were asked
//! for but are gone.
//!
//! Memory is what the bytes take, not what the reads were: output is kept in
//! one byte store of fixed-size blocks (`blocks`), and consecutive reads of
//! one channel merge into one run, so a command writing a byte at a time costs a byte a byte
//! (a chunk per read once cost ~100 bytes of bookkeeping each). Runs are
//! bounded too ([`RUN_BYTES`] of output per run at the least), in case the
//! two channels alternate byte by byte. Beside its own capacity, a ring
//! charges a [`Budget`] shared by every running exec with the memory its
//! blocks really take, and gives up its own oldest output while the agent's
//! total is over it, so many chatty commands together cannot take more than
//! the budget (and a block each of slack).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use silo_protocol::exec::{Channel, StreamOffsets};
use silo_protocol::limits::MAX_FRAME_PAYLOAD;

use super::blocks::Blocks;

/// Memory charged for one run's bookkeeping.
pub const RUN_COST: usize = 32;
/// A ring keeps at most one run per this many bytes of capacity ...
pub const RUN_BYTES: usize = 64;
/// ... or this many, whichever is more.
const MIN_RUNS: usize = 16;

/// Output memory shared by every running exec's ring.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    fn refund(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// One read's worth of output, or a run of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of `data[0]` in the exec's output.
    pub seq: u64,
    /// Stdout or stderr.
    pub channel: Channel,
    /// The bytes.
    pub data: Bytes,
}

/// What a replay request gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Offset of the first replayed byte (where the live stream continues if nothing is held).
    pub next_seq: u64,
    /// Bytes between the requested offset and `next_seq` that the ring no longer holds.
    pub lost_bytes: u64,
    /// Held output from `next_seq` on, in chunks of at most one frame.
    pub chunks: Vec<Chunk>,
}

/// Consecutive output of one channel.
#[derive(Debug, Clone, Copy)]
struct Run {
    seq: u64,
    channel: Channel,
    len: usize,
}

/// The recent-output window of one exec.
#[derive(Debug)]
pub struct Ring {
    /// The held bytes, oldest first; `runs` says which channel each is.
    bytes: Blocks,
    runs: VecDeque<Run>,
    capacity: usize,
    /// Offset of the next byte to be produced (total produced so far).
    end: u64,
    /// Bytes of each stream produced before the oldest held byte, so an
    /// offset in the combined output converts to one per stream.
    gone: StreamOffsets,
    /// The agent-wide budget this ring is charged to, while it is.
    budget: Option<Arc<Budget>>,
}

impl Ring {
    /// An empty ring holding at most `capacity` bytes (0 keeps nothing),
    /// charged to no shared budget.
    pub fn new(capacity: usize) -> Self {
        Self {
            bytes: Blocks::default(),
            runs: VecDeque::new(),
            capacity,
            end: 0,
            gone: StreamOffsets::default(),
            budget: None,
        }
    }

    /// The same, charged to `budget` until [`Ring::release`].
    pub fn with_budget(capacity: usize, budget: Arc<Budget>) -> Self {
        let mut ring = Self::new(capacity);
        ring.budget = Some(budget);
        ring
    }

    /// Appends output, evicting the oldest to stay within capacity and the
    /// shared budget. Returns its sequence number.
    pub fn push(&mut self, channel: Channel, data: &[u8]) -> u64 {
        let seq = self.end;
        self.end += data.len() as u64;
        if data.is_empty() || self.capacity == 0 {
            add(&mut self.gone, channel, data.len() as u64);
            return seq;
        }
        // More than the whole ring keeps only its tail.
        let skip = data.len().saturating_sub(self.capacity);
        let data = &data[skip..];
        let kept_seq = seq + skip as u64;
        let before = self.charged();
        // What a single write drops of itself goes after everything held:
        // the held runs are all older and are dropped first.
        if skip > 0 {
            self.forget_held();
            add(&mut self.gone, channel, skip as u64);
        }
        match self.runs.back_mut() {
            Some(last) if last.channel == channel && last.seq + last.len as u64 == kept_seq => {
                last.len += data.len();
            }
            _ => self.runs.push_back(Run {
                seq: kept_seq,
                channel,
                len: data.len(),
            }),
        }
        self.bytes.extend(data);
        self.account(before);
        let max_runs = (self.capacity / RUN_BYTES).max(MIN_RUNS);
        loop {
            let over_capacity = self.bytes.len().saturating_sub(self.capacity);
            let over_budget = self.budget_excess();
            if over_capacity == 0 && over_budget == 0 && self.runs.len() <= max_runs {
                break;
            }
            let before = self.charged();
            if !self.evict_oldest(over_capacity.max(over_budget)) {
                break;
            }
            self.account(before);
        }
        seq
    }

    /// Total bytes produced so far; the next chunk's sequence number.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes held.
    pub fn held(&self) -> usize {
        self.bytes.len()
    }

    /// Offset of the oldest byte still held (`end` when nothing is).
    pub fn start(&self) -> u64 {
        self.runs.front().map_or(self.end, |r| r.seq)
    }

    /// Stops charging the shared budget (the exec finished, and finished
    /// output is bounded elsewhere), and gives back buffer space it holds
    /// beyond its bytes.
    pub fn release(&mut self) {
        let charged = self.charged();
        if let Some(budget) = self.budget.take() {
            budget.refund(charged);
        }
        self.bytes.shrink();
        self.runs.shrink_to_fit();
    }

    /// Memory the ring takes: its blocks and its runs' bookkeeping.
    pub fn memory(&self) -> usize {
        self.charged()
    }

    /// Drops every held byte (a finished exec's output past the budget for
    /// finished output); a replay then counts all of it as lost, exactly.
    pub fn discard(&mut self) {
        let before = self.charged();
        self.forget_held();
        self.runs.shrink_to_fit();
        self.account(before);
    }

    /// Drops every held byte, counting each run's as gone (the caller
    /// accounts for the memory).
    fn forget_held(&mut self) {
        self.bytes.drain_front(usize::MAX);
        for run in &self.runs {
            add(&mut self.gone, run.channel, run.len as u64);
        }
        self.runs.clear();
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
        let mut chunks = Vec::new();
        let mut offset = 0usize;
        for run in &self.runs {
            let run_end = run.seq + run.len as u64;
            if run_end > next_seq {
                // Both differences lie inside a run, so they fit in usize.
                let skip = usize::try_from(next_seq.saturating_sub(run.seq)).unwrap_or(run.len);
                let mut at = offset + skip;
                let stop = offset + run.len;
                while at < stop {
                    let take = (stop - at).min(MAX_FRAME_PAYLOAD);
                    chunks.push(Chunk {
                        seq: run.seq + (at - offset) as u64,
                        channel: run.channel,
                        data: self.bytes.copy_range(at, take).into(),
                    });
                    at += take;
                }
            }
            offset += run.len;
        }
        Replay {
            next_seq,
            lost_bytes,
            chunks,
        }
    }

    /// The bytes of each stream produced before `seq` (clamped to what is
    /// held: an offset before the oldest held byte counts from there).
    pub fn streams_at(&self, seq: u64) -> StreamOffsets {
        let mut at = self.gone;
        for run in &self.runs {
            if run.seq >= seq {
                break;
            }
            let before = (seq - run.seq).min(run.len as u64);
            add(&mut at, run.channel, before);
        }
        at
    }

    /// Where a replay for a client that has `have` of each stream starts:
    /// the combined offset of the first byte either stream still lacks
    /// (the oldest held byte when one is gone), and how many of the
    /// wanted bytes the ring no longer holds.
    pub fn seq_of(&self, have: StreamOffsets) -> (u64, u64) {
        let lost = self.gone.stdout.saturating_sub(have.stdout)
            + self.gone.stderr.saturating_sub(have.stderr);
        if lost > 0 {
            return (self.start(), lost);
        }
        let mut count = self.gone;
        let mut first = self.end;
        for run in &self.runs {
            let (counted, wanted) = match run.channel {
                Channel::Stderr => (&mut count.stderr, have.stderr),
                _ => (&mut count.stdout, have.stdout),
            };
            let len = run.len as u64;
            if wanted < *counted + len {
                first = run.seq + wanted.saturating_sub(*counted);
                break;
            }
            *counted += len;
        }
        (first, lost)
    }

    /// Drops at least `want` of the oldest bytes (a whole run when that is
    /// less, or `want` is 0); false when nothing is left to drop.
    fn evict_oldest(&mut self, want: usize) -> bool {
        let Some(first) = self.runs.front_mut() else {
            return false;
        };
        let channel = first.channel;
        let drop_bytes = if want > 0 && want < first.len {
            first.len -= want;
            first.seq += want as u64;
            want
        } else {
            let len = first.len;
            self.runs.pop_front();
            len
        };
        add(&mut self.gone, channel, drop_bytes as u64);
        self.bytes.drain_front(drop_bytes);
        true
    }

    /// How far the shared budget is over, while this ring has bytes to give.
    fn budget_excess(&self) -> usize {
        match &self.budget {
            Some(budget) if !self.bytes.is_empty() => budget.used().saturating_sub(budget.limit),
            _ => 0,
        }
    }

    /// What this ring costs: its blocks and its runs' bookkeeping.
    fn charged(&self) -> usize {
        self.bytes.allocated() + self.runs.len() * RUN_COST
    }

    fn account(&self, before: usize) {
        if let Some(budget) = &self.budget {
            let now = self.charged();
            if now > before {
                budget.charge(now - before);
            } else {
                budget.refund(before - now);
            }
        }
    }
}

/// Counts `bytes` more of `channel`'s output.
fn add(offsets: &mut StreamOffsets, channel: Channel, bytes: u64) {
    match channel {
        Channel::Stderr => offsets.stderr += bytes,
        _ => offsets.stdout += bytes,
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::blocks::BLOCK;

    fn ring_with(capacity: usize, parts: &[&'static str]) -> Ring {
        let mut ring = Ring::new(capacity);
        for (i, part) in parts.iter().enumerate() {
            let channel = if i % 2 == 0 {
                Channel::Stdout
            } else {
                Channel::Stderr
            };
            ring.push(channel, part.as_bytes());
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
    fn offsets_convert_between_the_combined_output_and_each_stream() {
        // out "hello " (0..6), err "world" (6..11), out "!" (11..12)
        let ring = ring_with(100, &["hello ", "world", "!"]);
        let at = |seq| {
            let s = ring.streams_at(seq);
            (s.stdout, s.stderr)
        };
        assert_eq!(at(0), (0, 0));
        assert_eq!(at(8), (6, 2));
        assert_eq!(at(12), (7, 5));
        let have = |stdout, stderr| ring.seq_of(StreamOffsets { stdout, stderr });
        assert_eq!(have(0, 0), (0, 0));
        assert_eq!(have(6, 0), (6, 0), "stderr from its first byte");
        assert_eq!(have(6, 5), (11, 0), "stdout's last byte");
        assert_eq!(have(3, 5), (3, 0), "the earlier of the two");
        assert_eq!(have(7, 5), (12, 0), "nothing wanted: the end");
    }

    #[test]
    fn stream_offsets_count_what_eviction_dropped() {
        // out "aaaa" is evicted whole, err "bbbb" and out "cccc" stay.
        let ring = ring_with(8, &["aaaa", "bbbb", "cccc"]);
        let at = ring.streams_at(ring.start());
        assert_eq!((at.stdout, at.stderr), (4, 0));
        let have = |stdout, stderr| ring.seq_of(StreamOffsets { stdout, stderr });
        assert_eq!(have(4, 0), (4, 0));
        assert_eq!(have(1, 2), (4, 3), "3 stdout bytes gone");
        assert_eq!(have(6, 4), (10, 0));
        let mut big = Ring::new(4);
        big.push(Channel::Stderr, b"xy");
        big.push(Channel::Stdout, b"0123456789");
        let at = big.streams_at(big.start());
        assert_eq!(
            (at.stdout, at.stderr),
            (6, 2),
            "a write larger than the ring"
        );
        let mut discarded = ring_with(100, &["ab", "c"]);
        discarded.discard();
        let at = discarded.streams_at(discarded.start());
        assert_eq!((at.stdout, at.stderr), (2, 1));
    }

    #[test]
    fn sequence_numbers_are_byte_offsets_across_channels() {
        let mut ring = Ring::new(100);
        assert_eq!(ring.push(Channel::Stdout, b"abc"), 0);
        assert_eq!(ring.push(Channel::Stderr, b"de"), 3);
        assert_eq!(ring.push(Channel::Stdout, b""), 5);
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

    #[test]
    fn single_bytes_coalesce_and_cost_a_byte_each() {
        let budget = Budget::new(1 << 20);
        let mut ring = Ring::with_budget(1 << 20, Arc::clone(&budget));
        for i in 0..300_000u64 {
            assert_eq!(ring.push(Channel::Stdout, b"x"), i);
        }
        assert_eq!(ring.held(), 300_000);
        assert!(
            budget.used() <= 300_000 + BLOCK + RUN_COST,
            "one run, charged once, and the blocks' real size: {}",
            budget.used()
        );
        let r = ring.replay(299_990);
        assert_eq!(text(&r), "xxxxxxxxxx");
        // Whole replays come back in frames no larger than the wire allows.
        assert!(
            ring.replay(0)
                .chunks
                .iter()
                .all(|c| c.data.len() <= MAX_FRAME_PAYLOAD)
        );
        drop(ring);
        assert_eq!(budget.used(), 0, "a dropped ring gives its charge back");
    }

    #[test]
    fn interleaved_channels_are_bounded_in_runs_and_exact_in_offsets() {
        let mut ring = Ring::new(64 * 32);
        for i in 0..10_000u64 {
            let channel = if i % 2 == 0 {
                Channel::Stdout
            } else {
                Channel::Stderr
            };
            ring.push(channel, b"y");
        }
        assert!(ring.runs.len() <= MIN_RUNS.max(64 * 32 / RUN_BYTES));
        let r = ring.replay(0);
        assert_eq!(
            r.next_seq + r.chunks.iter().map(|c| c.data.len() as u64).sum::<u64>(),
            10_000
        );
        assert_eq!(r.lost_bytes, r.next_seq);
        for pair in r.chunks.windows(2) {
            assert_eq!(pair[0].seq + pair[0].data.len() as u64, pair[1].seq);
        }
    }

    #[test]
    fn a_shared_budget_makes_the_chatty_ring_give_up_its_oldest_output() {
        let budget = Budget::new(1000);
        let mut quiet = Ring::with_budget(4096, Arc::clone(&budget));
        quiet.push(Channel::Stdout, &[b'q'; 600]);
        let mut chatty = Ring::with_budget(4096, Arc::clone(&budget));
        for _ in 0..100 {
            chatty.push(Channel::Stdout, &[b'c'; 50]);
        }
        assert!(budget.used() <= 1000 + RUN_COST, "{}", budget.used());
        assert_eq!(quiet.held(), 600, "the quiet ring keeps what it had");
        let r = chatty.replay(0);
        assert_eq!(
            r.lost_bytes as usize + chatty.held(),
            5000,
            "lost bytes are exact"
        );
        chatty.release();
        quiet.release();
        assert_eq!(budget.used(), 0);
        // Released rings keep their bytes for replay, outside the budget.
        assert_eq!(quiet.held(), 600);
    }

    /// The promise of per-stream offsets: whatever was written, on either
    /// stream, however much the ring dropped, a client that has `have` of
    /// each stream gets exactly the rest of each that is still held, and
    /// the count of what is gone, once.
    mod stream_offsets {
        use proptest::prelude::*;

        use super::*;

        /// One write: the stream and its length.
        fn write() -> impl Strategy<Value = (bool, usize)> {
            (any::<bool>(), 0usize..40)
        }

        fn channel(stderr: bool) -> Channel {
            if stderr {
                Channel::Stderr
            } else {
                Channel::Stdout
            }
        }

        proptest! {
            #[test]
            fn a_replay_by_stream_offsets_gives_each_stream_its_rest(
                capacity in 0usize..96,
                writes in proptest::collection::vec(write(), 0..40),
                discard in any::<bool>(),
                have in (0u64..400, 0u64..400),
            ) {
                let mut ring = Ring::new(capacity);
                // Every byte ever written, per stream, numbered so that a
                // misplaced one shows.
                let (mut out, mut err): (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
                let mut next = 0u8;
                for (stderr, len) in writes {
                    let data: Vec<u8> = (0..len).map(|_| { next = next.wrapping_add(1); next }).collect();
                    if stderr { err.extend(&data) } else { out.extend(&data) }
                    ring.push(channel(stderr), &data);
                }
                if discard {
                    ring.discard();
                }
                let have = StreamOffsets {
                    stdout: have.0.min(out.len() as u64),
                    stderr: have.1.min(err.len() as u64),
                };
                let gone = ring.streams_at(ring.start());
                let (seq, lost) = ring.seq_of(have);
                let replay = ring.replay(seq);
                prop_assert_eq!(
                    lost,
                    gone.stdout.saturating_sub(have.stdout) + gone.stderr.saturating_sub(have.stderr)
                );
                // The client's side: count each stream from where the agent
                // says it stands, keep only what it lacks.
                let mut at = ring.streams_at(replay.next_seq);
                let (mut got_out, mut got_err): (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
                let mut expect_seq = replay.next_seq;
                for chunk in &replay.chunks {
                    prop_assert_eq!(chunk.seq, expect_seq);
                    expect_seq += chunk.data.len() as u64;
                    let (count, wanted, got) = match chunk.channel {
                        Channel::Stderr => (&mut at.stderr, have.stderr, &mut got_err),
                        _ => (&mut at.stdout, have.stdout, &mut got_out),
                    };
                    let skip = wanted.saturating_sub(*count).min(chunk.data.len() as u64) as usize;
                    got.extend_from_slice(&chunk.data[skip..]);
                    *count += chunk.data.len() as u64;
                }
                prop_assert_eq!(expect_seq, ring.end());
                prop_assert_eq!(at.stdout, out.len() as u64);
                prop_assert_eq!(at.stderr, err.len() as u64);
                let from_out = have.stdout.max(gone.stdout) as usize;
                let from_err = have.stderr.max(gone.stderr) as usize;
                prop_assert_eq!(&got_out[..], &out[from_out..]);
                prop_assert_eq!(&got_err[..], &err[from_err..]);
            }
        }
    }
}
