//! Keys as the server databases store them (PostgreSQL's and MariaDB's schemas): a shard's
//! scope, identifier and destination, an object's identifier beside its wide bytes. Shared by
//! the backends whose columns are typed (SQLite's columns hold either kind of identifier).

use outbox_core::{Id, ShardKey};

/// What starts a wide shard's stored destination: a control character, which no
/// [`Destination`](outbox_core::Destination) holds.
pub const WIDE: char = '\u{1}';

/// A shard's identifier and destination as `outbox_messages` and `outbox_shards` store them.
/// An integer shard's are its own: the integer, and the destination ('' for a local outbox).
/// A wide shard's identifier column holds `i64::MAX` and its destination column the wide
/// identifier's 32 hex digits after [`WIDE`], then the destination: the tables, their
/// indexes and the statements are the integer path's, and a wide shard is never an integer
/// one (no destination starts with a control character).
pub fn stored_shard(shard: &ShardKey) -> (i64, String) {
    match shard.shard_identifier.as_wide() {
        None => (
            shard.shard_identifier.as_integer().unwrap_or_default(),
            shard.destination_str().to_owned(),
        ),
        Some(wide) => (
            i64::MAX,
            format!("{WIDE}{wide:032x}{}", shard.destination_str()),
        ),
    }
}

/// The shard key of a stored (scope, identifier, destination): [`stored_shard`] read back.
pub fn shard_from_stored(
    scope: i16,
    identifier: i64,
    destination: String,
) -> Result<ShardKey, String> {
    let Some(rest) = destination.strip_prefix(WIDE) else {
        return Ok(ShardKey::from_stored(
            scope,
            Id::integer(identifier),
            destination,
        ));
    };
    let wide = rest
        .get(..32)
        .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        .filter(|_| identifier == i64::MAX)
        .ok_or_else(|| format!("{destination:?} is not a wide shard's stored destination"))?;
    Ok(ShardKey::from_stored(
        scope,
        Id::wide(wide),
        rest[32..].to_owned(),
    ))
}

/// An object identifier as `outbox_messages` stores it: an integer in `object_identifier`
/// with an empty `object_wide`; a wide one's 16 bytes in `object_wide`, with
/// `object_identifier` folded from them, so that the group index narrows a lookup to the
/// object (rare folds that meet are told apart by `object_wide`).
pub fn stored_object(object: Id) -> (i64, Vec<u8>) {
    match object.as_wide() {
        None => (object.as_integer().unwrap_or_default(), Vec::new()),
        Some(wide) => {
            let folded = (wide as u64) ^ ((wide >> 64) as u64);
            (folded as i64, wide.to_be_bytes().to_vec())
        }
    }
}

/// The object of a stored (identifier, wide bytes): [`stored_object`] read back. No wide
/// bytes: the integer; else the wide identifier they hold (an error if they hold none).
pub fn object_from_stored(identifier: i64, wide: &[u8]) -> Result<Id, sqlx::Error> {
    if wide.is_empty() {
        Ok(Id::integer(identifier))
    } else {
        crate::sql::wide_id(wide)
    }
}
