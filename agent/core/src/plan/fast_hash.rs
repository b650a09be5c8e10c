//! A small, fixed-seed hasher for the pass's lookup tables.
//!
//! The pass looks names up tens of thousands of times; a B-tree search compares whole names at
//! every level, and the standard hasher (SipHash) spends more on a short name than the lookup
//! saves. This is the multiply-rotate hash rustc uses for its own tables (FxHash): a few
//! instructions per 8 bytes. It resists no chosen keys, which is fine for names read from the
//! cluster's objects within one pass. Tables built with it are for lookups only: their
//! iteration order must never reach an output.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A lookup table keyed by names (iteration order is arbitrary: never iterate it into output).
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A membership set of names (iteration order is arbitrary: never iterate it into output).
pub type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// FxHash: `hash = (hash.rotate_left(5) ^ word) * SEED` over the input, 8 bytes at a time.
#[derive(Default, Clone, Copy)]
pub struct FastHasher {
    hash: u64,
}

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}
