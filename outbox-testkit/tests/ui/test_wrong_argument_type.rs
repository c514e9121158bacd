#[outbox_testkit::test]
async fn writes_an_outbox(pool: sqlx::PgPool) {
    let _ = pool;
}

fn main() {}
