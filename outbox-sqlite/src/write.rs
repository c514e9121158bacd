use outbox_core::{Error, Message, MessageId};
use sqlx::SqliteExecutor;

use crate::error::database;

const INSERT_ONE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
    RETURNING id";

// One statement for any number of messages: the rows travel as one JSON array parameter.
const INSERT_MANY: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5 \
    FROM json_each(?1) ORDER BY key \
    RETURNING id";

/// Writes one message with the caller's executor: a transaction (`&mut *tx`), a connection,
/// or a pool. It commits or rolls back with the caller's transaction (S1).
pub async fn write<'e, E: SqliteExecutor<'e>>(
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
pub async fn write_all<'e, E: SqliteExecutor<'e>>(
    executor: E,
    messages: &[Message],
) -> Result<Vec<MessageId>, Error> {
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<serde_json::Value> = messages
        .iter()
        .map(|message| {
            let shard = message.shard();
            serde_json::json!([
                shard.scope.0,
                shard.shard_identifier,
                shard.destination_str(),
                message.category().0,
                message.object_identifier(),
                message.payload_json(),
            ])
        })
        .collect();
    let mut ids: Vec<i64> = sqlx::query_scalar(INSERT_MANY)
        .bind(serde_json::Value::Array(rows).to_string())
        .fetch_all(executor)
        .await
        .map_err(database("writing outbox messages"))?;
    ids.sort_unstable();
    Ok(ids.into_iter().map(MessageId).collect())
}
