//! Pod addresses on the loopback range. Linux routes all of 127.0.0.0/8 to
//! `lo`, so each pod gets an address of its own there and every container
//! port is published on it under the same number: a client "inside the
//! cluster" reaches `podIP:port` as it would on a pod network, and two
//! pods can use the same port. Nothing here is a bridge address.
//!
//! Each mock instance claims one block `127.77.B.0/24` (so at most 253
//! pods live at once per instance) through a lock file naming its pid, so
//! instances running side by side (tests in parallel, a binary beside
//! them) never hand out the same address; a lock whose process is gone is
//! taken over.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Mutex;

/// The second octet of every pod address.
pub const POD_OCTET: u8 = 77;
/// The node's address: where `hostIP` points.
pub const HOST_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// The first and last host part of a pod address in a block.
const FIRST_POD: u8 = 2;
const LAST_POD: u8 = 254;
/// The blocks instances may claim.
const FIRST_BLOCK: u8 = 1;
const LAST_BLOCK: u8 = 254;
/// The directory (under the system's temporary directory) of block locks.
const LOCK_DIR: &str = "silo-mock-kubernetes-addresses";

/// Why no block of addresses could be had.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// The lock directory is unusable.
    #[error("the address lock directory {path} is unusable")]
    LockDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Every block is held by a live process.
    #[error("every pod address block 127.{POD_OCTET}.1-254.0/24 is taken by a running mock")]
    Exhausted,
}

/// One instance's block of pod addresses.
#[derive(Debug)]
pub struct AddressBlock {
    block: u8,
    lock: PathBuf,
    state: Mutex<Allocation>,
}

#[derive(Debug)]
struct Allocation {
    next: u8,
    used: BTreeSet<u8>,
}

impl AddressBlock {
    /// Claims a free block, starting the search at a random one.
    pub fn claim() -> Result<Self, AddressError> {
        let dir = std::env::temp_dir().join(LOCK_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| AddressError::LockDir {
            path: dir.clone(),
            source,
        })?;
        let mut seed = [0u8; 1];
        getrandom::fill(&mut seed).ok();
        let span = u16::from(LAST_BLOCK - FIRST_BLOCK) + 1;
        for offset in 0..span {
            let index = (u16::from(seed[0]) + offset) % span;
            let block = FIRST_BLOCK + u8::try_from(index).unwrap_or(0);
            let lock = dir.join(format!("127.{POD_OCTET}.{block}"));
            if try_lock(&lock) {
                return Ok(Self {
                    block,
                    lock,
                    state: Mutex::new(Allocation {
                        next: FIRST_POD,
                        used: BTreeSet::new(),
                    }),
                });
            }
        }
        Err(AddressError::Exhausted)
    }

    /// The block's network, for messages (`127.77.B.0/24`).
    pub fn network(&self) -> String {
        format!("127.{POD_OCTET}.{}.0/24", self.block)
    }

    /// A free pod address, or `None` when the block is full.
    pub fn allocate(&self) -> Option<Ipv4Addr> {
        let mut state = self.state.lock().ok()?;
        for _ in FIRST_POD..=LAST_POD {
            let candidate = state.next;
            state.next = if candidate >= LAST_POD {
                FIRST_POD
            } else {
                candidate + 1
            };
            if state.used.insert(candidate) {
                return Some(Ipv4Addr::new(127, POD_OCTET, self.block, candidate));
            }
        }
        None
    }

    /// Gives an address back once its pod is gone.
    pub fn release(&self, address: Ipv4Addr) {
        let [_, _, block, host] = address.octets();
        if block == self.block {
            if let Ok(mut state) = self.state.lock() {
                state.used.remove(&host);
            }
        }
    }
}

impl Drop for AddressBlock {
    fn drop(&mut self) {
        std::fs::remove_file(&self.lock).ok();
    }
}

/// Takes the lock at `path`: made new, or taken over from a process that is gone.
fn try_lock(path: &std::path::Path) -> bool {
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut file) => {
                return write!(file, "{}", std::process::id()).is_ok();
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                let alive = holder
                    .trim()
                    .parse::<u32>()
                    .is_ok_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
                if alive {
                    return false;
                }
                std::fs::remove_file(path).ok();
            }
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_exclusive_and_addresses_unique() {
        let a = AddressBlock::claim().unwrap();
        let b = AddressBlock::claim().unwrap();
        assert_ne!(a.block, b.block);
        let first = a.allocate().unwrap();
        let second = a.allocate().unwrap();
        assert_ne!(first, second);
        assert_eq!(first.octets()[..3], [127, POD_OCTET, a.block]);
        a.release(first);
        let lock = a.lock.clone();
        drop(a);
        assert!(!lock.exists());
    }

    #[test]
    fn a_full_block_says_so_and_reuses_released_addresses() {
        let block = AddressBlock::claim().unwrap();
        let all: Vec<Ipv4Addr> = std::iter::from_fn(|| block.allocate()).collect();
        assert_eq!(all.len(), usize::from(LAST_POD - FIRST_POD) + 1);
        block.release(all[10]);
        assert_eq!(block.allocate(), Some(all[10]));
        assert_eq!(block.allocate(), None);
    }
}
