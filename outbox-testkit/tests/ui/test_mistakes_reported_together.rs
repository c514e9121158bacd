use outbox_testkit::postgres::PgTestDatabase;
use outbox_testkit::sqlite::SqliteTestDatabase;

#[outbox_testkit::test(flavor = "single_thread")]
fn two_databases(pg: PgTestDatabase, sqlite: SqliteTestDatabase) {
    let _ = (pg, sqlite);
}

fn main() {}
