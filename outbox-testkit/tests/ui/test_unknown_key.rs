use outbox_testkit::sqlite::SqliteTestDatabase;

#[outbox_testkit::test(flavor = "current_thread", migration = false)]
async fn starts_empty(db: SqliteTestDatabase) {
    let _ = db.pool();
}

fn main() {}
