//! The hash tables of the pass's lookups.
//!
//! The pass looks names up tens of thousands of times; a B-tree search compares whole names at
//! every level, and the standard hasher (SipHash) spends more on a short name than the lookup
//! saves. foldhash costs a few instructions per 8 bytes and is seeded at random per process
//! and per table: the names hashed are chosen by tenants (PortMaps, namespaces, Services), and
//! a fixed-seed hash would let one craft names that all fall into one bucket and make every
//! agent's pass quadratic. A random seed also means a table's iteration order differs from run
//! to run, so if one were ever iterated into an output the determinism tests would see it:
//! these tables are for lookups only.

/// A lookup table keyed by names (iteration order is random: never iterate it into output).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A membership set of names (iteration order is random: never iterate it into output).
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
