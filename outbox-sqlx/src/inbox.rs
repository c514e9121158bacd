//! A consumer's inbox ([`Inbox`](outbox_core::inbox::Inbox)) on the caller's executor: the
//! backends' [`InboxTarget`](outbox_core::inbox::InboxTarget) implementations call these.
//! And a store as a [`Consumer`](outbox_core::inbox::Consumer)'s database
//! ([`InboxDatabase`]).

use std::any::Any;
use std::time::Duration;

use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{InboxDatabase, InboxDeadLetter, InboxTransaction, StoredInboxDeadLetter};
use outbox_core::{Error, MessageId};
use sqlx::{Database, Executor, Transaction};

use crate::dialect::Dialect;
use crate::error::database;
use crate::sql::{Executes, Statement, With, get};
use crate::store::{SqlxStore, from_ms};

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
    let done = executor
        .execute(purge_query::<D>(Some(consumer), age))
        .await
        .map_err(database::<D>("purging the inbox"))?;
    Ok(D::rows_affected(&done))
}

/// The statement deleting the records older than `age`, of `consumer` or of every consumer.
fn purge_query<D: Dialect>(
    consumer: Option<&str>,
    age: Duration,
) -> Statement<'static, D::Database> {
    let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    match consumer {
        Some(consumer) => sqlx::query(D::SQL.inbox.purge)
            .with(consumer.to_owned())
            .with(age),
        None => sqlx::query(D::SQL.inbox.purge_all).with(age),
    }
}

/// A consumer's transaction on a backend's database.
struct ConsumerTransaction<D: Dialect> {
    tx: Transaction<'static, D::Database>,
}

impl<D: Dialect> InboxDatabase for SqlxStore<D> {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn InboxTransaction>, Error>> {
        Box::pin(async move {
            let tx = self
                .pool
                .begin_with(D::BEGIN_CALLER)
                .await
                .map_err(database::<D>("beginning a consumer's transaction"))?;
            Ok(Box::new(ConsumerTransaction::<D> { tx }) as Box<dyn InboxTransaction>)
        })
    }

    fn purge_inbox<'a>(
        &'a self,
        consumer: Option<&'a str>,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(self.write(purge_query::<D>(consumer, age), "purging the inbox"))
    }

    fn dead_letters<'a>(
        &'a self,
        consumer: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredInboxDeadLetter>, Error>> {
        const OPERATION: &str = "listing a consumer's dead letters";
        Box::pin(async move {
            let query = sqlx::query(D::SQL.inbox.dead_letters)
                .with(consumer.map(str::to_owned))
                .with(i64::try_from(limit).unwrap_or(i64::MAX));
            let rows = self.rows(query, OPERATION).await?;
            rows.iter()
                .map(|row| {
                    let read = || -> Result<StoredInboxDeadLetter, sqlx::Error> {
                        Ok(StoredInboxDeadLetter::new(
                            get::<D::Database, i64>(row, 0)?,
                            get::<D::Database, String>(row, 1)?,
                            get::<D::Database, Option<i64>>(row, 2)?.map(MessageId),
                            get::<D::Database, Option<String>>(row, 3)?,
                            get::<D::Database, String>(row, 4)?,
                            get::<D::Database, Vec<u8>>(row, 5)?,
                            get::<D::Database, String>(row, 6)?,
                            u32::try_from(get::<D::Database, i64>(row, 7)?).unwrap_or(u32::MAX),
                            from_ms(get::<D::Database, i64>(row, 8)?),
                        ))
                    };
                    read().map_err(database::<D>(OPERATION))
                })
                .collect()
        })
    }
}

impl<D: Dialect> InboxTransaction for ConsumerTransaction<D> {
    fn record<'a>(
        &'a mut self,
        consumer: &'a str,
        message: MessageId,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(record::<D, _>(
            D::Database::on(&mut self.tx),
            consumer,
            message,
        ))
    }

    fn purge<'a>(
        &'a mut self,
        consumer: &'a str,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(purge::<D, _>(D::Database::on(&mut self.tx), consumer, age))
    }

    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a InboxDeadLetter<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let query = sqlx::query(D::SQL.inbox.dead_letter)
            .with(letter.consumer.to_owned())
            .with(letter.message_id.map(|id| id.0))
            .with(letter.category.map(str::to_owned))
            .with(letter.headers.clone())
            .with(letter.payload.to_vec())
            .with(letter.error.clone())
            .with(i64::from(letter.attempts));
        Box::pin(async move {
            query
                .execute(D::Database::on(&mut self.tx))
                .await
                .map_err(database::<D>("recording a consumer's dead letter"))?;
            Ok(())
        })
    }

    fn connection(&mut self) -> &mut (dyn Any + Send) {
        let conn: &mut <D::Database as Database>::Connection = &mut self.tx;
        conn
    }

    fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            self.tx
                .commit()
                .await
                .map_err(database::<D>("committing a consumer's transaction"))
        })
    }
}
