//! Many shards per statement: the claims of a batch, the heads of its claimed shards, and the
//! acknowledgements and releases of the shards that finished together, each in a fixed number
//! of statements whatever the batch's size. The shards travel as one JSON array parameter
//! (`jsonb_each`, whose elements are read without parsing each again), as the messages of a
//! write do; what comes back is one row holding a JSON
//! array, because `sqlx` hands each SQLite row over from the connection's thread on its own.
//! A join walks the array and seeks the table by key: `CROSS JOIN` fixes that order, where
//! SQLite's planner would scan a table its statistics call small.

use std::collections::HashMap;

use outbox_core::store::{ClaimOptions, Lease, StoredMessage};
use outbox_core::{Error, ShardKey};
use outbox_sqlx::dialect::{Finished, Finishing};
use outbox_sqlx::error::database;
use sqlx::{SqliteConnection, SqlitePool};

use super::{SqliteDialect, decode, id_json, json_error};

/// The shards `keys` as the JSON array parameter: each `[scope, identifier, destination,
/// extra]`, the identifier as a number or a wide one's hex digits, `extra` a token, a place
/// or a row's id.
fn shards_json<'a>(keys: impl IntoIterator<Item = (&'a ShardKey, i64)>) -> String {
    let keys: Vec<serde_json::Value> = keys
        .into_iter()
        .map(|(shard, extra)| {
            serde_json::json!([
                shard.scope.0,
                id_json(shard.shard_identifier),
                shard.destination_str(),
                extra
            ])
        })
        .collect();
    serde_json::Value::Array(keys).to_string()
}

/// The tokens of `leases` as a JSON array.
fn tokens_json<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Result<String, Error> {
    let tokens: Vec<i64> = leases.into_iter().map(|lease| lease.token).collect();
    serde_json::to_string(&tokens).map_err(json_error)
}

/// The columns of a shard key read from `jsonb_each`'s `value`.
macro_rules! key_of {
    ($alias:literal) => {
        concat!(
            $alias,
            ".value ->> 0, iif(json_type(",
            $alias,
            ".value, '$[1]') = 'text', unhex(",
            $alias,
            ".value ->> 1), ",
            $alias,
            ".value ->> 1), ",
            $alias,
            ".value ->> 2"
        )
    };
}

// `?1` the new counter's increment: the last of the tokens it hands out.
const NEXT_TOKENS: &str = "\
    UPDATE outbox_sequences SET value = value + ?1 WHERE name = 'lease_token' RETURNING value";

// The shards `?1` that have a state row, as one JSON array: each one's place in `?1` and, if
// its lease lapsed without a release, its holder (else NULL).
pub(crate) const STATES: &str = concat!(
    "SELECT json_group_array(json_array(w.key, iif(s.lease_owner IS NOT NULL \
            AND s.lease_expires_at <= ",
    now!(),
    ", s.lease_owner, NULL))) \
     FROM jsonb_each(?1) w CROSS JOIN outbox_shards s \
        ON (s.shard_scope, s.shard_identifier, s.destination) = (",
    key_of!("w"),
    ")"
);

// CLAIM for each of the shards `?1` (each with its token): `?2` the worker, `?3` the lease's
// milliseconds. Which were claimed is read after it, by CLAIMED: `sqlx` hands each row a
// `RETURNING` returns over on its own. (The WHERE of the SELECT tells SQLite that ON CONFLICT
// is the upsert's, not a join's.)
pub(crate) const CLAIM_MANY: &str = concat!(
    "WITH want(shard_scope, shard_identifier, destination, lease_token) AS ( \
        SELECT ",
    key_of!("w"),
    ", w.value ->> 3 FROM jsonb_each(?1) w) \
     INSERT INTO outbox_shards \
        (shard_scope, shard_identifier, destination, lease_owner, lease_token, lease_expires_at) \
     SELECT shard_scope, shard_identifier, destination, ?2, lease_token, ",
    now!(),
    " + ?3 FROM want WHERE NOT ",
    outbox_sqlx::paused!(
        "want.shard_scope",
        "want.shard_identifier",
        "want.destination"
    ),
    " ",
    claim_upsert!()
);

// Those of the shards `?1` (each with its token) whose state rows hold their tokens, once
// CLAIM_MANY ran: each `[place in ?1, attempts]`, as one JSON array.
pub(crate) const CLAIMED: &str = concat!(
    "SELECT json_group_array(json_array(w.key, s.attempts)) \
     FROM jsonb_each(?1) w CROSS JOIN outbox_shards s \
        ON (s.shard_scope, s.shard_identifier, s.destination) = (",
    key_of!("w"),
    ") AND s.lease_token = w.value ->> 3"
);

// The first `?2` rows of each of the shards `?1`, as one JSON array of the head read's rows,
// each led by its shard's place in `?1`. Each shard's key is read from the array once; its
// bound (its `?2`-th id) is found before its rows are, and the read of its rows stops there.
pub(crate) const HEADS: &str = concat!(
    "WITH keys(n, shard_scope, shard_identifier, destination) AS MATERIALIZED ( \
        SELECT w.key, ",
    key_of!("w"),
    " FROM jsonb_each(?1) w) \
     SELECT json_group_array(json_array(k.n, m.id, m.category, m.shard_scope, ",
    id_json!("m.object_identifier"),
    ", m.payload, m.created_at * 1000, m.metadata)) \
     FROM keys k CROSS JOIN outbox_messages m \
        ON m.shard_scope = k.shard_scope AND m.shard_identifier = k.shard_identifier \
        AND m.destination = k.destination AND m.id <= coalesce((SELECT x.id \
            FROM outbox_messages x WHERE x.shard_scope = k.shard_scope \
                AND x.shard_identifier = k.shard_identifier AND x.destination = k.destination \
            ORDER BY x.id LIMIT 1 OFFSET ?2 - 1), 9223372036854775807)"
);

// Which of the leases `?1` (each `[scope, identifier, destination, token]`) are still held,
// by their place in `?1`.
pub(crate) const HELD: &str = concat!(
    "SELECT json_group_array(w.key) FROM jsonb_each(?1) w CROSS JOIN outbox_shards s \
        ON (s.shard_scope, s.shard_identifier, s.destination) = (",
    key_of!("w"),
    ") AND s.lease_token = w.value ->> 3"
);

// Which of the rows `?1` (each `[scope, identifier, destination, id]`) are still there, in
// their shard: their ids. (Exactly these go: an id is only ever acknowledged in its shard.)
pub(crate) const PRESENT: &str = concat!(
    "SELECT json_group_array(m.id) FROM jsonb_each(?1) a CROSS JOIN outbox_messages m \
        ON m.id = a.value ->> 3 \
        AND (m.shard_scope, m.shard_identifier, m.destination) = (",
    key_of!("a"),
    ")"
);

pub(crate) const DELETE_MESSAGES: &str =
    "DELETE FROM outbox_messages WHERE id IN (SELECT value FROM json_each(?1))";

// Releases those of the leases of the shards `?1` whose tokens are among `?2` that are still
// held: deletes their shards' state rows. (The shards' keys and the tokens go apart: SQLite
// reads a row value of four columns twice.) A drained shard's state row goes with its lease, as
// on PostgreSQL: its state is all reset anyway, and a shard with no state row is due (a row
// written since its read is found by the next sweep, or drained again on the commit's
// wake-up).
pub(crate) const RELEASE_HELD: &str = concat!(
    "DELETE FROM outbox_shards WHERE (shard_scope, shard_identifier, destination) IN (SELECT ",
    key_of!("w"),
    " FROM jsonb_each(?1) w) AND lease_token IN (SELECT value FROM json_each(?2))"
);

// Extends by `?3` milliseconds from now those of the leases of the shards `?1` whose tokens
// are among `?2` that are still held (as RELEASE_HELD, the keys and tokens apart).
const EXTEND_HELD: &str = concat!(
    "UPDATE outbox_shards SET lease_expires_at = ",
    now!(),
    " + ?3 WHERE (shard_scope, shard_identifier, destination) IN (SELECT ",
    key_of!("w"),
    " FROM jsonb_each(?1) w) AND lease_token IN (SELECT value FROM json_each(?2))"
);

/// Extends `leases` by `lease_ms` from now in one statement on `conn` (a transaction of its
/// own): whether each was still held, in order, read back (by [`HELD`]) only if some were
/// not. The outer error is the statement's as `sqlx` gave it, so that the caller can tell a
/// busy database from another failure.
pub(super) async fn extend_held(
    conn: &mut SqliteConnection,
    leases: &[Lease],
    lease_ms: i64,
) -> Result<Result<Vec<bool>, Error>, sqlx::Error> {
    let keys = shards_json(leases.iter().map(|lease| (&lease.shard, lease.token)));
    let tokens = match tokens_json(leases) {
        Ok(tokens) => tokens,
        Err(error) => return Ok(Err(error)),
    };
    let extended = sqlx::query(EXTEND_HELD)
        .bind(&keys)
        .bind(tokens)
        .bind(lease_ms)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if extended == leases.len() as u64 {
        return Ok(Ok(vec![true; leases.len()]));
    }
    let held: String = sqlx::query_scalar(HELD)
        .bind(&keys)
        .fetch_one(&mut *conn)
        .await?;
    Ok(held_places(&held, leases.len()))
}

/// Which of `count` leases [`HELD`] found held, from its JSON array of their places.
fn held_places(held: &str, count: usize) -> Result<Vec<bool>, Error> {
    let mut places = vec![false; count];
    for place in serde_json::from_str::<Vec<usize>>(held).map_err(json_error)? {
        if let Some(slot) = places.get_mut(place) {
            *slot = true;
        }
    }
    Ok(places)
}

/// Leased claims of `shards` in the write transaction on `tx`, in four statements: the
/// tokens, the shards' state rows (and the lapsed leases' holders), the claims, and which were
/// claimed (not read where no shard had a state row and every claim inserted one).
pub(super) async fn claim_all(
    tx: &mut SqliteConnection,
    shards: &[ShardKey],
    options: &ClaimOptions,
) -> Result<Vec<Lease>, Error> {
    let failed = || database::<SqliteDialect>("claiming shards");
    let count = i64::try_from(shards.len()).unwrap_or(i64::MAX);
    let last: i64 = sqlx::query_scalar(NEXT_TOKENS)
        .bind(count)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed())?;
    let first = last - count + 1;
    let keys = shards_json(shards.iter().zip(first..));
    let states: String = sqlx::query_scalar(STATES)
        .bind(&keys)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed())?;
    let states =
        serde_json::from_str::<Vec<(usize, Option<String>)>>(&states).map_err(json_error)?;
    let fresh = states.is_empty();
    let lapsed: HashMap<usize, String> = states
        .into_iter()
        .filter_map(|(place, owner)| Some((place, owner?)))
        .collect();
    let inserted = sqlx::query(CLAIM_MANY)
        .bind(&keys)
        .bind(options.worker.clone())
        .bind(i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(failed())?
        .rows_affected();
    // Where no shard had a state row and every one was claimed (a sweep of shards that never
    // failed, nearly always), each claim inserted its shard's row: no attempts, no holder
    // before. Otherwise the claims are read back.
    let claimed: Vec<(usize, i64)> = if fresh && inserted == shards.len() as u64 {
        (0..shards.len()).map(|place| (place, 0)).collect()
    } else {
        let claimed: String = sqlx::query_scalar(CLAIMED)
            .bind(&keys)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed())?;
        serde_json::from_str(&claimed).map_err(json_error)?
    };
    let mut leases = Vec::with_capacity(claimed.len());
    for (place, attempts) in claimed {
        let Some(shard) = shards.get(place) else {
            return Err(Error::Database {
                operation: "claiming shards",
                source: format!("a claim read the place {place}, not one it was given").into(),
            });
        };
        leases.push(Lease {
            shard: shard.clone(),
            token: first + i64::try_from(place).unwrap_or(i64::MAX),
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            previous_owner: lapsed.get(&place).cloned(),
        });
    }
    leases.sort_unstable_by_key(|lease| lease.token);
    Ok(leases)
}

/// The first `limit` rows of the head of each shard of `leases`, in their order, read in one
/// statement on `pool`.
pub(super) async fn heads(
    pool: &SqlitePool,
    leases: &[Lease],
    limit: usize,
) -> Result<Vec<Vec<StoredMessage>>, Error> {
    const OPERATION: &str = "reading shards";
    let json: String = sqlx::query_scalar(HEADS)
        .bind(shards_json(leases.iter().map(|lease| (&lease.shard, 0))))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await
        .map_err(database::<SqliteDialect>(OPERATION))?;
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(&json).map_err(json_error)?;
    let mut heads: Vec<Vec<StoredMessage>> = leases.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let place = row.first().and_then(serde_json::Value::as_u64);
        let Some(head) = place
            .and_then(|place| usize::try_from(place).ok())
            .and_then(|place| heads.get_mut(place))
        else {
            return Err(Error::Database {
                operation: OPERATION,
                source: format!("a head row of no shard read: {row:?}").into(),
            });
        };
        head.push(decode(&row[1..])?);
    }
    for head in &mut heads {
        head.sort_unstable_by_key(|message| message.id);
    }
    Ok(heads)
}

const OPERATION: &str = "acknowledging and releasing drained shards";

/// The acknowledgements and releases of `batch` in the write transaction on `conn`. A lease no
/// longer held changes nothing of its shard.
///
/// Nearly always every lease is still held and every row acknowledged is still there: then
/// two statements do it all, the release of every lease and the delete of every row, each
/// seen whole by its count of rows changed. (SQLite hands each row a statement returns over
/// from the connection's thread on its own, so `RETURNING` costs more than asking first.) When
/// a count falls short, both are undone and [`finish_checked`] asks first.
pub(super) async fn finish_all(
    conn: &mut SqliteConnection,
    batch: &[Finishing],
) -> Result<Vec<Finished>, Error> {
    let failed = || database::<SqliteDialect>(OPERATION);
    let leases = shards_json(
        batch
            .iter()
            .map(|(lease, _, _)| (&lease.shard, lease.token)),
    );
    let ids: Vec<i64> = batch
        .iter()
        .flat_map(|(_, _, acks)| acks.iter().flat_map(|ack| &ack.ids))
        .map(|id| id.0)
        .collect();
    savepoint(conn, "SAVEPOINT outbox_finish_all").await?;
    let tokens = tokens_json(batch.iter().map(|(lease, _, _)| lease))?;
    let mut whole = sqlx::query(RELEASE_HELD)
        .bind(&leases)
        .bind(tokens)
        .execute(&mut *conn)
        .await
        .map_err(failed())?
        .rows_affected()
        == batch.len() as u64;
    if whole && !ids.is_empty() {
        whole = sqlx::query(DELETE_MESSAGES)
            .bind(serde_json::to_string(&ids).map_err(json_error)?)
            .execute(&mut *conn)
            .await
            .map_err(failed())?
            .rows_affected()
            == ids.len() as u64;
    }
    if !whole {
        savepoint(conn, "ROLLBACK TO SAVEPOINT outbox_finish_all").await?;
    }
    savepoint(conn, "RELEASE SAVEPOINT outbox_finish_all").await?;
    if !whole {
        return finish_checked(conn, batch, &leases).await;
    }
    Ok(batch
        .iter()
        .map(|(_, _, acks)| {
            let rows = acks.iter().map(|ack| ack.ids.len() as u64).sum();
            Ok((rows, true))
        })
        .collect())
}

async fn savepoint(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), Error> {
    sqlx::query(sql)
        .execute(conn)
        .await
        .map_err(database::<SqliteDialect>(OPERATION))?;
    Ok(())
}

/// [`finish_all`] asking first, in four statements: which leases are held, which of their rows
/// are there (in their shards), then those rows and the state rows of the shards held.
async fn finish_checked(
    conn: &mut SqliteConnection,
    batch: &[Finishing],
    leases: &str,
) -> Result<Vec<Finished>, Error> {
    let failed = || database::<SqliteDialect>(OPERATION);
    let held: String = sqlx::query_scalar(HELD)
        .bind(leases)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed())?;
    let held_places = held_places(&held, batch.len())?;
    // The rows of the shards held, each with the place of its shard.
    let acked: HashMap<i64, usize> = batch
        .iter()
        .zip(&held_places)
        .enumerate()
        .filter(|(_, (_, held))| **held)
        .flat_map(|(place, ((_, _, acks), _))| {
            acks.iter()
                .flat_map(|ack| &ack.ids)
                .map(move |id| (id.0, place))
        })
        .collect();
    let mut deleted = vec![0_u64; batch.len()];
    if !acked.is_empty() {
        let rows = shards_json(
            acked
                .iter()
                .map(|(&id, &place)| (&batch[place].0.shard, id)),
        );
        let present: String = sqlx::query_scalar(PRESENT)
            .bind(rows)
            .fetch_one(&mut *conn)
            .await
            .map_err(failed())?;
        let present: Vec<i64> = serde_json::from_str(&present).map_err(json_error)?;
        for id in &present {
            if let Some(count) = acked.get(id).and_then(|&place| deleted.get_mut(place)) {
                *count += 1;
            }
        }
        if !present.is_empty() {
            sqlx::query(DELETE_MESSAGES)
                .bind(serde_json::to_string(&present).map_err(json_error)?)
                .execute(&mut *conn)
                .await
                .map_err(failed())?;
        }
    }
    if held_places.contains(&true) {
        let released: Vec<&Lease> = batch
            .iter()
            .zip(&held_places)
            .filter(|(_, held)| **held)
            .map(|((lease, _, _), _)| lease)
            .collect();
        sqlx::query(RELEASE_HELD)
            .bind(shards_json(
                released.iter().map(|lease| (&lease.shard, lease.token)),
            ))
            .bind(tokens_json(released.iter().copied())?)
            .execute(&mut *conn)
            .await
            .map_err(failed())?;
    }
    Ok(batch
        .iter()
        .zip(held_places)
        .zip(deleted)
        .map(|(((lease, _, _), held), deleted)| {
            if held {
                Ok((deleted, true))
            } else {
                Err(Error::LeaseLost {
                    shard: lease.shard.clone(),
                    token: lease.token,
                })
            }
        })
        .collect())
}
