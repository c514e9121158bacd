//! An executor that counts the statements run through it.

use std::fmt;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use sqlx::{Database, Either, Execute, Executor};

/// Wraps a connection and counts the statements executed through it: proof that a bulk write
/// is one statement, not one per row.
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

impl<'c, C, DB> Executor<'c> for &'c mut CountingExecutor<'_, C>
where
    C: Send,
    DB: Database,
    for<'x> &'x mut C: Executor<'x, Database = DB>,
{
    type Database = DB;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<DB::QueryResult, DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        self.statements += 1;
        (&mut *self.inner).fetch_many(query)
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        self.statements += 1;
        (&mut *self.inner).fetch_optional(query)
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, Result<DB::Statement, sqlx::Error>>
    where
        'c: 'e,
    {
        (&mut *self.inner).prepare_with(sql, parameters)
    }
}
