//! A consumer's inbox ([`Inbox`](outbox_core::inbox::Inbox)) on the caller's executor: the
//! backends' [`InboxTarget`](outbox_core::inbox::InboxTarget) implementations call these.

use std::time::Duration;

use outbox_core::{Error, MessageId};
use sqlx::Executor;

use crate::dialect::Dialect;
use crate::error::database;
use crate::sql::With;

/// Records `message` for `consumer` on `executor` unless it is recorded; returns whether it
/// was new. Waits while another open transaction has recorded it.
pub async fn record<'e, D, E>(
    executor: E,
    consumer: &str,
    message: MessageId,
) -> Result<bool, Error>
where
    D: Dialect,
    E: Executor<'e, Database = D::Database>,
{
    let query = sqlx::query(D::SQL.inbox.record)
        .with(consumer.to_owned())
        .with(message.0);
    let done = executor
        .execute(query)
        .await
        .map_err(database::<D>("recording a message in the inbox"))?;
    Ok(D::rows_affected(&done) == 1)
}

/// Deletes `consumer`'s records older than `age` on `executor`; returns how many.
pub async fn purge<'e, D, E>(executor: E, consumer: &str, age: Duration) -> Result<u64, Error>
where
    D: Dialect,
    E: Executor<'e, Database = D::Database>,
{
    let query = sqlx::query(D::SQL.inbox.purge)
        .with(consumer.to_owned())
        .with(i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
    let done = executor
        .execute(query)
        .await
        .map_err(database::<D>("purging the inbox"))?;
    Ok(D::rows_affected(&done))
}
