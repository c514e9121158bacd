//! An executor that counts the statements run through it.

use std::fmt;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use outbox_sqlx::sql::Runner;
use sqlx::{Database, Either, Execute, Executor};

/// Wraps a transaction or a pooled connection and counts the statements executed through it:
/// proof that a bulk write is one statement, not one per row.
pub struct CountingExecutor<'a, C> {
    inner: &'a mut C,
    statements: usize,
}

impl<'a, C> CountingExecutor<'a, C> {
    /// Wraps `inner`.
    pub fn new(inner: &'a mut C) -> Self {
        Self {
            inner,
            statements: 0,
        }
    }

    /// How many statements ran so far.
    pub fn statements(&self) -> usize {
        self.statements
    }
}

impl<C> fmt::Debug for CountingExecutor<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingExecutor")
            .field("statements", &self.statements)
            .finish_non_exhaustive()
    }
}

impl<'c, C> Executor<'c> for &'c mut CountingExecutor<'_, C>
where
    C: Runner,
{
    type Database = C::Database;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<
        'e,
        Result<
            Either<<C::Database as Database>::QueryResult, <C::Database as Database>::Row>,
            sqlx::Error,
        >,
    >
    where
        'c: 'e,
        E: 'q + Execute<'q, C::Database>,
    {
        self.statements += 1;
        self.inner.executor().fetch_many(query)
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<<C::Database as Database>::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, C::Database>,
    {
        self.statements += 1;
        self.inner.executor().fetch_optional(query)
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [<C::Database as Database>::TypeInfo],
    ) -> BoxFuture<'e, Result<<C::Database as Database>::Statement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.inner.executor().prepare_with(sql, parameters)
    }
}

impl<C: Runner> Runner for CountingExecutor<'_, C> {
    type Database = C::Database;

    fn executor(&mut self) -> impl Executor<'_, Database = C::Database> {
        self
    }
}
