//! Byte mutation of seed inputs: bit flips, interesting values, inserted,
//! deleted, duplicated and spliced ranges, and dictionary tokens.

use fastrand::Rng;

/// Most mutations stacked on one input.
const MAX_STACK: usize = 8;
/// Longest range one mutation inserts or removes.
const MAX_RANGE: usize = 64;
/// Bytes that often sit on a parser's edge.
const INTERESTING: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, b'/', b'.', b'0', b'7', b'\n'];

/// Returns a mutated copy of `seed`; `others` supply splices and `dict`
/// tokens (names, keys, magic strings) to insert or overwrite with.
pub fn mutate(rng: &mut Rng, seed: &[u8], others: &[Vec<u8>], dict: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..rng.usize(1..=MAX_STACK) {
        mutate_once(rng, &mut out, others, dict);
    }
    out
}

fn mutate_once(rng: &mut Rng, out: &mut Vec<u8>, others: &[Vec<u8>], dict: &[Vec<u8>]) {
    let len = out.len();
    match rng.u8(0..9) {
        0 if len > 0 => {
            let at = rng.usize(..len);
            out[at] ^= 1 << rng.u8(0..8);
        }
        1 if len > 0 => {
            let at = rng.usize(..len);
            out[at] = INTERESTING[rng.usize(..INTERESTING.len())];
        }
        2 if len > 0 => {
            let at = rng.usize(..len);
            out[at] = rng.u8(..);
        }
        3 => {
            let at = rng.usize(..=len);
            let n = rng.usize(1..=MAX_RANGE);
            let bytes: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(n).collect();
            out.splice(at..at, bytes);
        }
        4 if len > 0 => {
            let at = rng.usize(..len);
            let end = (at + rng.usize(1..=MAX_RANGE)).min(len);
            out.drain(at..end);
        }
        5 if len > 0 => {
            let at = rng.usize(..len);
            let end = (at + rng.usize(1..=MAX_RANGE)).min(len);
            let copy = out[at..end].to_vec();
            let to = rng.usize(..=out.len());
            out.splice(to..to, copy);
        }
        6 if !others.is_empty() => {
            let other = &others[rng.usize(..others.len())];
            let cut = rng.usize(..=len);
            let from = rng.usize(..=other.len());
            out.truncate(cut);
            out.extend_from_slice(&other[from..]);
        }
        7 if !dict.is_empty() => {
            let token = &dict[rng.usize(..dict.len())];
            let at = rng.usize(..=len);
            if rng.bool() {
                let end = (at + token.len()).min(len);
                out.splice(at..end, token.iter().copied());
            } else {
                out.splice(at..at, token.iter().copied());
            }
        }
        8 if len > 0 => out.truncate(rng.usize(..len)),
        _ => out.push(rng.u8(..)),
    }
}

/// Random bytes for `arbitrary` to shape into a typed input.
pub fn entropy(rng: &mut Rng, max: usize) -> Vec<u8> {
    let n = rng.usize(..=max);
    std::iter::repeat_with(|| rng.u8(..)).take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_mutant() {
        let seed = b"hello world".to_vec();
        let a = mutate(&mut Rng::with_seed(7), &seed, &[], &[b"..".to_vec()]);
        let b = mutate(&mut Rng::with_seed(7), &seed, &[], &[b"..".to_vec()]);
        assert_eq!(a, b);
    }
}
