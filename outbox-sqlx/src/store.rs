//! The outbox store on a `sqlx` pool.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::store::{
    Admin, ClaimOptions, DiscoveryPage, Lease, MIGRATIONS_TABLE, PendingMessage, ShardState,
    check_migrations,
};
use outbox_core::{CategoryId, Error, Id, MessageId, ShardKey, Store};
use sqlx::{Database, Pool};

use crate::dialect::{Claim, Dialect};
use crate::error::database;
use crate::session::{SqlxSession, duration_ms, fenced, shard_keyed};
use crate::sql::{Executes, Statement, With, get};

const APPLIED_MIGRATIONS: &str = "SELECT version FROM _outbox_migrations WHERE success";
const NEWEST_MESSAGE: &str = "SELECT max(id) FROM outbox_messages";

/// The outbox store on a database of a `sqlx` backend.
#[derive(Debug)]
pub struct SqlxStore<D: Dialect> {
    pool: Pool<D::Database>,
    dialect: D,
}

impl<D: Dialect> Clone for SqlxStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            dialect: self.dialect.clone(),
        }
    }
}

impl<D: Dialect + Default> SqlxStore<D> {
    /// A store on `pool`. Apply the migrations first.
    pub fn new(pool: Pool<D::Database>) -> Self {
        Self::with_dialect(pool, D::default())
    }
}

impl<D: Dialect> SqlxStore<D> {
    /// A store on `pool` with a dialect value of the caller's.
    pub fn with_dialect(pool: Pool<D::Database>, dialect: D) -> Self {
        Self { pool, dialect }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<D::Database> {
        &self.pool
    }

    /// Runs `query` on a pooled connection: its rows.
    async fn rows(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<Vec<<D::Database as Database>::Row>, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(database::<D>(operation))?;
        query
            .fetch_all(D::Database::on(&mut conn))
            .await
            .map_err(database::<D>(operation))
    }

    /// Runs `query` on a pooled connection: the rows it affected.
    async fn execute(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<u64, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(database::<D>(operation))?;
        let done = query
            .execute(D::Database::on(&mut conn))
            .await
            .map_err(database::<D>(operation))?;
        Ok(D::rows_affected(&done))
    }

    /// Runs `query` on a pooled connection: the first column of its one row.
    async fn scalar<T>(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<T, Error>
    where
        D::Database: crate::sql::Decodes<T>,
    {
        let rows = self.rows(query, operation).await?;
        let row = rows.first().ok_or_else(|| Error::Database {
            operation,
            source: "the statement returned no row".into(),
        })?;
        get::<D::Database, T>(row, 0).map_err(database::<D>(operation))
    }
}

fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The columns a shard key takes: scope, identifier, destination.
const KEY_COLUMNS: usize = 3;

/// A shard key as the statements return it from column `first` on: a key that does not have
/// the schema's form (written around its checks) is a typed error, never a panic.
fn shard_key<D: Dialect>(
    row: &<D::Database as Database>::Row,
    first: usize,
    operation: &'static str,
) -> Result<ShardKey, Error> {
    D::decode_shard(row, first).map_err(|error| Error::Undecodable {
        operation,
        message_id: None,
        detail: format!("a shard key is not (SMALLINT, identifier, text): {error}"),
    })
}

impl<D: Dialect> Store for SqlxStore<D> {
    type Session = SqlxSession<D>;
    type Wakeups = D::Wakeups;

    async fn check_schema(&self) -> Result<(), Error> {
        const OPERATION: &str = "checking the outbox schema";
        let exists: bool = self
            .scalar(
                sqlx::query(D::SQL.table_exists).with(MIGRATIONS_TABLE),
                OPERATION,
            )
            .await?;
        if !exists {
            return Err(Error::MigrationMissing {
                detail: format!("table `{MIGRATIONS_TABLE}` does not exist"),
            });
        }
        let applied = self
            .rows(sqlx::query(APPLIED_MIGRATIONS), OPERATION)
            .await?
            .iter()
            .map(|row| get::<D::Database, i64>(row, 0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(database::<D>(OPERATION))?;
        check_migrations(&applied, D::MIGRATIONS)?;
        crate::migrate::note_newer_schema::<D>(&applied);
        D::check_schema(&self.pool).await
    }

    async fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> Result<DiscoveryPage, Error> {
        const OPERATION: &str = "discovering due shards";
        // Below every SMALLINT scope, so the first page starts at the first shard.
        let first = ShardKey::local(outbox_core::ScopeId(0), Id::integer(i64::MIN));
        let (scope, cursor) = match after {
            Some(key) => (i32::from(key.scope.0), key),
            None => (i32::from(i16::MIN) - 1, &first),
        };
        let limit = i32::try_from(limit.max(1)).unwrap_or(i32::MAX);
        let query = D::bind_shard(sqlx::query(D::SQL.discover).with(scope), cursor).with(limit);
        let rows = self.rows(query, OPERATION).await?;
        let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
        let mut page = DiscoveryPage::default();
        let visited = rows.len();
        for (index, row) in rows.iter().enumerate() {
            let key = shard_key::<D>(row, 0, OPERATION)?;
            if full && index + 1 == visited {
                page.next = Some(key.clone());
            }
            if get::<D::Database, bool>(row, KEY_COLUMNS).map_err(database::<D>(OPERATION))? {
                page.due.push(key);
            }
        }
        Ok(page)
    }

    async fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<SqlxSession<D>>, Error> {
        let Some(Claim { lease, claiming }) =
            self.dialect.claim(&self.pool, shard, options).await?
        else {
            return Ok(None);
        };
        Ok(Some(SqlxSession::new(
            self.pool.clone(),
            self.dialect.clone(),
            lease,
            options.lease,
            claiming,
        )))
    }

    async fn wakeups(&self) -> Result<Option<D::Wakeups>, Error> {
        D::wakeups(&self.pool).await
    }

    async fn extend_lease(&self, lease: &Lease, duration: Duration) -> Result<bool, Error> {
        let _turn = self.dialect.take_turn().await;
        let query = fenced::<D>(D::SQL.extend_lease, lease).with(duration_ms(duration));
        Ok(self.execute(query, "extending a lease").await? > 0)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let _turn = self.dialect.take_turn().await;
        let query = fenced::<D>(D::SQL.release_interrupted, lease);
        Ok(self.execute(query, "releasing a lease").await? > 0)
    }

    async fn unpark(&self, known: &[CategoryId]) -> Result<u64, Error> {
        let known: Vec<i32> = known.iter().map(|category| category.0).collect();
        let query = D::bind_categories(sqlx::query(D::SQL.unpark), known);
        self.execute(query, "resuming parked shards").await
    }

    async fn newest_message_id(&self) -> Result<Option<MessageId>, Error> {
        let newest: Option<i64> = self
            .scalar(sqlx::query(NEWEST_MESSAGE), "reading the newest message id")
            .await?;
        Ok(newest.map(MessageId))
    }

    async fn pending_in_shard(&self, shard: &ShardKey, up_to: MessageId) -> Result<u64, Error> {
        let query = shard_keyed::<D>(D::SQL.pending_in_shard, shard).with(up_to.0);
        let count: i64 = self
            .scalar(query, "counting a shard's pending messages")
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }
}

impl<D: Dialect> Admin for SqlxStore<D> {
    async fn reschedule(&self, shard: &ShardKey) -> Result<bool, Error> {
        let query = shard_keyed::<D>(D::SQL.reschedule, shard);
        Ok(self.execute(query, "rescheduling a shard").await? > 0)
    }

    async fn pending_messages(&self, limit: usize) -> Result<Vec<PendingMessage>, Error> {
        const OPERATION: &str = "listing pending messages";
        let query =
            sqlx::query(D::SQL.pending_messages).with(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self.rows(query, OPERATION).await?;
        let pending =
            |row: &<D::Database as Database>::Row| -> Result<PendingMessage, sqlx::Error> {
                let category = 1 + KEY_COLUMNS;
                let payload = category + 1 + D::OBJECT_COLUMNS;
                Ok(PendingMessage::new(
                    MessageId(get::<D::Database, _>(row, 0)?),
                    D::decode_shard(row, 1)?,
                    CategoryId(get::<D::Database, _>(row, category)?),
                    D::decode_object(row, category + 1)?,
                    get::<D::Database, _>(row, payload)?,
                    from_ms(get::<D::Database, _>(row, payload + 1)?),
                ))
            };
        rows.iter()
            .map(|row| pending(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn shard_states(&self) -> Result<Vec<ShardState>, Error> {
        const OPERATION: &str = "listing shard states";
        let rows = self
            .rows(sqlx::query(D::SQL.shard_states), OPERATION)
            .await?;
        let state = |row: &<D::Database as Database>::Row| -> Result<ShardState, sqlx::Error> {
            // The columns after the key, counted from the key's end.
            let at = |index: usize| KEY_COLUMNS + index;
            let time =
                |index| get::<D::Database, Option<i64>>(row, at(index)).map(|ms| ms.map(from_ms));
            Ok(ShardState::new(
                D::decode_shard(row, 0)?,
                u32::try_from(get::<D::Database, i64>(row, at(0))?).unwrap_or(u32::MAX),
                get::<D::Database, _>(row, at(1))?,
                time(2)?,
                get::<D::Database, _>(row, at(3))?,
                time(4)?,
                get::<D::Database, _>(row, at(5))?,
                get::<D::Database, Option<i32>>(row, at(6))?.map(CategoryId),
            ))
        };
        rows.iter()
            .map(|row| state(row).map_err(database::<D>(OPERATION)))
            .collect()
    }
}
