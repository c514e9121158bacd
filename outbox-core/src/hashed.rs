//! The maps and sets of the relay's hot path, keyed by shard keys, ids and categories the
//! outbox's own tables hold: hashed with `foldhash`'s fast hasher rather than the standard
//! library's SipHash, which cost the sparse drain (one message per shard) about a tenth of
//! the relay's processor time in hashing alone.

/// A map with the fast hasher.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A set with the fast hasher.
pub(crate) type Set<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
