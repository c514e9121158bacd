use outbox_core::{Error, Message, MessageId};
use sqlx::PgExecutor;

use crate::error::database;

const INSERT_ONE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    VALUES ($1, $2, $3, $4, $5, $6::text::jsonb) \
    RETURNING id";

// One statement for any number of messages: the columns travel as arrays.
const INSERT_MANY: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    SELECT scope, shard, destination, category, object, payload::jsonb \
    FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::integer[], $5::bigint[], \
        $6::text[]) AS rows(scope, shard, destination, category, object, payload) \
    RETURNING id";

/// Writes one message with the caller's executor: a transaction (`&mut *tx`), a connection,
/// or a pool. It commits or rolls back with the caller's transaction (S1).
pub async fn write<'e, E: PgExecutor<'e>>(
    executor: E,
    message: &Message,
) -> Result<MessageId, Error> {
    let shard = message.shard();
    let id: i64 = sqlx::query_scalar(INSERT_ONE)
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str())
        .bind(message.category().0)
        .bind(message.object_identifier())
        .bind(message.payload_json())
        .fetch_one(executor)
        .await
        .map_err(database("writing an outbox message"))?;
    Ok(MessageId(id))
}

/// Writes many messages in one statement (S5), with the caller's executor. Returns their
/// ids in ascending order.
pub async fn write_all<'e, E: PgExecutor<'e>>(
    executor: E,
    messages: &[Message],
) -> Result<Vec<MessageId>, Error> {
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let mut scopes = Vec::with_capacity(messages.len());
    let mut shards = Vec::with_capacity(messages.len());
    let mut destinations = Vec::with_capacity(messages.len());
    let mut categories = Vec::with_capacity(messages.len());
    let mut objects = Vec::with_capacity(messages.len());
    let mut payloads = Vec::with_capacity(messages.len());
    for message in messages {
        let shard = message.shard();
        scopes.push(shard.scope.0);
        shards.push(shard.shard_identifier);
        destinations.push(shard.destination_str());
        categories.push(message.category().0);
        objects.push(message.object_identifier());
        payloads.push(message.payload_json());
    }
    let mut ids: Vec<i64> = sqlx::query_scalar(INSERT_MANY)
        .bind(scopes)
        .bind(shards)
        .bind(destinations)
        .bind(categories)
        .bind(objects)
        .bind(payloads)
        .fetch_all(executor)
        .await
        .map_err(database("writing outbox messages"))?;
    ids.sort_unstable();
    Ok(ids.into_iter().map(MessageId).collect())
}
