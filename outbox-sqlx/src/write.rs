//! Outbox messages written with the caller's executor.

use outbox_core::{Error, Message, MessageId, telemetry};
use sqlx::Executor;
use tracing::{Instrument, debug_span};

use crate::dialect::Dialect;
use crate::error::database;
use crate::sql::{With, get};

/// Writes one message with the caller's executor: a transaction (`&mut *tx`), a connection,
/// or a pool. It commits or rolls back with the caller's transaction.
pub async fn write<'e, D, E>(executor: E, message: &Message) -> Result<MessageId, Error>
where
    D: Dialect,
    E: Executor<'e, Database = D::Database>,
{
    let span = debug_span!(
        "outbox.write",
        category = message.category_name(),
        shard = %message.shard(),
        object = %message.object_identifier(),
    );
    let id = insert_one::<D, E>(executor, message)
        .instrument(span)
        .await?;
    telemetry::record_written(std::slice::from_ref(message));
    Ok(id)
}

async fn insert_one<'e, D, E>(executor: E, message: &Message) -> Result<MessageId, Error>
where
    D: Dialect,
    E: Executor<'e, Database = D::Database>,
{
    let shard = message.shard();
    let query = D::bind_shard(
        sqlx::query(D::SQL.insert_message).with(shard.scope.0),
        shard,
    )
    .with(message.category().0);
    let row = D::bind_object(query, message.object_identifier())
        .with(message.payload_json())
        .with(message.metadata().to_json())
        .fetch_one(executor)
        .await
        .map_err(database::<D>("writing an outbox message"))?;
    let id =
        get::<D::Database, i64>(&row, 0).map_err(database::<D>("writing an outbox message"))?;
    Ok(MessageId(id))
}

/// Writes many messages in one statement, with the caller's executor. Returns their
/// ids in ascending order.
pub async fn write_all<'e, D, E>(executor: E, messages: &[Message]) -> Result<Vec<MessageId>, Error>
where
    D: Dialect,
    E: Executor<'e, Database = D::Database>,
{
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let rows = D::bind_messages(sqlx::query(D::SQL.insert_messages), messages)
        .fetch_all(executor)
        .instrument(debug_span!("outbox.write", messages = messages.len()))
        .await
        .map_err(database::<D>("writing outbox messages"))?;
    let mut ids = rows
        .iter()
        .map(|row| get::<D::Database, i64>(row, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(database::<D>("writing outbox messages"))?;
    ids.sort_unstable();
    telemetry::record_written(messages);
    Ok(ids.into_iter().map(MessageId).collect())
}
