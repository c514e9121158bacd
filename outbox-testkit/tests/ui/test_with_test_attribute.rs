#[outbox_testkit::test]
#[test]
async fn writes_an_outbox(db: outbox_testkit::postgres::PgTestDatabase) {
    let _ = db.pool();
}

fn main() {}
