//! The databases `#[outbox_testkit::test]` hands to tests.

/// A database created for one test, gone when the value is dropped: what a test function
/// under [`#[outbox_testkit::test]`](crate::test) takes.
///
/// Implemented by [`PgTestDatabase`](crate::postgres::PgTestDatabase) (a new database on the
/// PostgreSQL server, dropped afterwards) and
/// [`SqliteTestDatabase`](crate::sqlite::SqliteTestDatabase) (a file in a temporary
/// directory, removed afterwards). Code generic over both can take `D: TestDatabase`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a test database",
    label = "`#[outbox_testkit::test]` hands the test a `PgTestDatabase` or a `SqliteTestDatabase`",
    note = "take `db: outbox_testkit::postgres::PgTestDatabase` or \
            `db: outbox_testkit::sqlite::SqliteTestDatabase`"
)]
pub trait TestDatabase: Sized {
    /// Creates an empty database.
    fn create() -> impl Future<Output = Self> + Send;

    /// Creates a database with the outbox migrations applied.
    fn migrated() -> impl Future<Output = Self> + Send;
}
