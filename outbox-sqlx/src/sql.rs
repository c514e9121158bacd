//! What the shared body needs of a `sqlx` database, gathered in one bound: [`Sql`].
//!
//! Code generic over `sqlx::Database` would otherwise repeat, at every function, bounds that
//! name concrete types (`i64: Encode<'_, DB> + Type<DB>`, `for<'c> &'c mut DB::Connection:
//! Executor<'c>`): Rust does not carry such bounds from a trait to its users. Here each one is
//! a trait of the database itself ([`Binds`], [`Decodes`], [`Executes`]) with a blanket
//! implementation, so [`Sql`] holds them all and `D::Database: Sql` implies every one. Any
//! `sqlx` driver whose types encode and decode the integers, strings and booleans the outbox
//! tables hold is [`Sql`] without writing anything.

use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Transaction, Type,
};

/// A query of database `DB` with its arguments.
pub type Statement<'q, DB> = Query<'q, DB, <DB as Database>::Arguments>;

/// A database whose queries bind a `T`.
pub trait Binds<T>: Database {
    /// Binds `value` as the next parameter of `query`.
    fn bind_value<'q>(query: Statement<'q, Self>, value: T) -> Statement<'q, Self>;
}

impl<DB: Database, T> Binds<T> for DB
where
    T: for<'t> Encode<'t, DB> + Type<DB>,
{
    fn bind_value<'q>(query: Statement<'q, Self>, value: T) -> Statement<'q, Self> {
        query.bind(value)
    }
}

/// A database whose rows decode a `T`.
pub trait Decodes<T>: Database {
    /// Column `index` of `row`.
    fn decode(row: &Self::Row, index: usize) -> Result<T, sqlx::Error>;
}

impl<DB: Database, T> Decodes<T> for DB
where
    T: for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn decode(row: &DB::Row, index: usize) -> Result<T, sqlx::Error> {
        // PostgreSQL's columns hold the types the schema gives them, and the statements cast
        // what they read to the type decoded (`payload::text`): a value's type is not checked
        // again against the Rust type (a third of the relay's decoding, at one message per
        // shard), and a value that does not decode still fails. SQLite's columns take any
        // value, and MariaDB's statements are not all cast: both are checked.
        if DB::NAME == "PostgreSQL" {
            row.try_get_unchecked(index)
        } else {
            row.try_get(index)
        }
    }
}

/// A database whose connections run statements.
pub trait Executes: Database {
    /// `conn`, as an executor.
    fn on(conn: &mut Self::Connection) -> impl Executor<'_, Database = Self>;
}

impl<DB: Database> Executes for DB
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    fn on(conn: &mut DB::Connection) -> impl Executor<'_, Database = Self> {
        conn
    }
}

/// Declares [`Sql`] as the bounds given, and implements it for every database that has them:
/// the list is written once.
macro_rules! all_of {
    ($($bound:tt)+) => {
        /// Everything the shared body asks of a `sqlx` database: implemented by every database
        /// that has what it takes (PostgreSQL's and SQLite's among them).
        pub trait Sql: $($bound)+ {}

        impl<DB> Sql for DB where DB: $($bound)+ {}
    };
}

all_of!(
    Database<Arguments: IntoArguments<Self>, Connection: sqlx::migrate::Migrate>
        + sqlx::database::HasStatementCache
        + Executes
        + Binds<i16>
        + Binds<i32>
        + Binds<i64>
        + Binds<String>
        + for<'a> Binds<&'a str>
        + Binds<Option<i32>>
        + Binds<Option<i64>>
        + Binds<Option<String>>
        + Binds<Vec<u8>>
        + Decodes<i16>
        + Decodes<i32>
        + Decodes<i64>
        + Decodes<bool>
        + Decodes<String>
        + Decodes<Option<i32>>
        + Decodes<Option<i64>>
        + Decodes<Option<String>>
        + Decodes<Vec<u8>>
);

/// `query.with(value)`: [`Binds::bind_value`] as a method.
pub trait With<DB: Database>: Sized {
    /// Binds `value` as the next parameter.
    #[must_use]
    fn with<T>(self, value: T) -> Self
    where
        DB: Binds<T>;
}

impl<DB: Database> With<DB> for Statement<'_, DB> {
    fn with<T>(self, value: T) -> Self
    where
        DB: Binds<T>,
    {
        DB::bind_value(self, value)
    }
}

/// Column `index` of `row`: `get::<DB, T>(&row, 2)`.
pub fn get<DB: Decodes<T>, T>(row: &DB::Row, index: usize) -> Result<T, sqlx::Error> {
    DB::decode(row, index)
}

/// The wide identifier a column's bytes hold; any length but 16 is a decode error.
pub fn wide_id(bytes: &[u8]) -> Result<outbox_core::Id, sqlx::Error> {
    outbox_core::Id::from_wide_bytes(bytes).ok_or_else(|| {
        sqlx::Error::Decode(format!("{} bytes are not a wide identifier", bytes.len()).into())
    })
}

/// Something statements run on one after another: a transaction, a pooled connection, or a
/// wrapper of either (a test's statement counter).
pub trait Runner: Send {
    /// The database.
    type Database: Database;

    /// The executor for the next statement.
    fn executor(&mut self) -> impl Executor<'_, Database = Self::Database>;
}

impl<DB: Executes> Runner for Transaction<'_, DB> {
    type Database = DB;

    fn executor(&mut self) -> impl Executor<'_, Database = DB> {
        DB::on(self)
    }
}

impl<DB: Executes> Runner for PoolConnection<DB> {
    type Database = DB;

    fn executor(&mut self) -> impl Executor<'_, Database = DB> {
        DB::on(self)
    }
}
