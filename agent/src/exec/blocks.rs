//! The byte store under an output ring: a queue of fixed-size blocks.
//!
//! A growing `VecDeque<u8>` doubles its buffer and keeps the doubled
//! buffer after evictions, so four chatty commands sharing a 4 MiB budget
//! could hold twice that in memory. Here memory is the held bytes plus at
//! most two partly used blocks (the oldest, partly evicted, and the newest,
//! partly filled), and [`Blocks::allocated`] says exactly what is held, so
//! the agent-wide budget charges real memory, not a count of bytes. Every
//! block but the newest is full, which makes an offset a division.

use std::collections::VecDeque;

/// Size of one full block. A block this size is its own `mmap` under musl's
/// allocator, so a freed block goes back to the kernel at once.
pub const BLOCK: usize = 64 * 1024;
/// Smallest allocation of a new block; a command that prints a line costs
/// this, not a whole block.
const FIRST_ALLOCATION: usize = 256;

/// Bytes in arrival order, oldest first.
#[derive(Debug, Default)]
pub struct Blocks {
    blocks: VecDeque<Vec<u8>>,
    /// Bytes at the front of the first block that were already dropped.
    head: usize,
    /// Bytes held.
    len: usize,
    /// Capacity of every block together.
    allocated: usize,
}

impl Blocks {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Memory the blocks take.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Appends `data` after the newest byte.
    pub fn extend(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.blocks.back().is_none_or(|last| last.len() == BLOCK) {
                self.blocks.push_back(Vec::new());
            }
            let Some(last) = self.blocks.back_mut() else {
                return;
            };
            let take = data.len().min(BLOCK - last.len());
            let needed = last.len() + take;
            if needed > last.capacity() {
                // Doubling within the block, so a slow trickle reallocates
                // a handful of times per block, never beyond the block.
                let target = needed
                    .max(last.capacity() * 2)
                    .clamp(FIRST_ALLOCATION, BLOCK);
                let before = last.capacity();
                last.reserve_exact(target - last.len());
                self.allocated += last.capacity() - before;
            }
            last.extend_from_slice(&data[..take]);
            self.len += take;
            data = &data[take..];
        }
    }

    /// Drops the `n` oldest bytes (all of them when `n` is more), freeing
    /// every block they emptied.
    pub fn drain_front(&mut self, n: usize) {
        let mut n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            let Some(first) = self.blocks.front() else {
                break;
            };
            let left = first.len() - self.head;
            if n < left {
                self.head += n;
                break;
            }
            n -= left;
            self.allocated -= first.capacity();
            self.blocks.pop_front();
            self.head = 0;
        }
        if self.len == 0 {
            self.blocks.clear();
            self.head = 0;
            self.allocated = 0;
        }
    }

    /// Copies `len` bytes starting `at` bytes after the oldest held one.
    /// The range must lie within what is held.
    pub fn copy_range(&self, at: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut global = self.head + at;
        let mut left = len;
        while left > 0 {
            let Some(block) = self.blocks.get(global / BLOCK) else {
                break;
            };
            let from = global % BLOCK;
            let take = left.min(block.len().saturating_sub(from));
            if take == 0 {
                break;
            }
            out.extend_from_slice(&block[from..from + take]);
            global += take;
            left -= take;
        }
        out
    }

    /// Gives back the unused end of the newest block.
    pub fn shrink(&mut self) {
        if let Some(last) = self.blocks.back_mut() {
            let before = last.capacity();
            last.shrink_to_fit();
            self.allocated -= before - last.capacity();
        }
        self.blocks.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cross_blocks_and_memory_follows_the_bytes() {
        let mut store = Blocks::default();
        let data: Vec<u8> = (0..(3 * BLOCK + 100)).map(|i| (i % 251) as u8).collect();
        for piece in data.chunks(1000) {
            store.extend(piece);
        }
        assert_eq!(store.len(), data.len());
        assert!(store.allocated() <= data.len() + BLOCK);
        assert_eq!(
            store.copy_range(BLOCK - 10, 20),
            data[BLOCK - 10..BLOCK + 10]
        );

        store.drain_front(BLOCK + 5);
        assert_eq!(store.len(), data.len() - BLOCK - 5);
        assert!(store.allocated() <= 3 * BLOCK, "the emptied block is freed");
        assert_eq!(store.copy_range(0, 10), data[BLOCK + 5..BLOCK + 15]);
        let tail = store.len();
        assert_eq!(store.copy_range(tail - 3, 3), data[data.len() - 3..]);

        store.drain_front(usize::MAX);
        assert_eq!((store.len(), store.allocated()), (0, 0));
    }

    #[test]
    fn a_line_costs_a_small_allocation_and_shrink_returns_the_rest() {
        let mut store = Blocks::default();
        store.extend(b"hello\n");
        assert_eq!(store.allocated(), FIRST_ALLOCATION);
        store.extend(&[b'x'; 300]);
        assert_eq!(store.allocated(), 2 * FIRST_ALLOCATION);
        store.shrink();
        assert_eq!(store.allocated(), 306);
    }
}
