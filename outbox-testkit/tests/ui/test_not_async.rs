use outbox_testkit::postgres::PgTestDatabase;

#[outbox_testkit::test]
fn writes_an_outbox(db: PgTestDatabase) {
    let _ = db.pool();
}

fn main() {}
