use outbox_core::{outbox_scope, replicated_model};

#[outbox_scope(id = 1)]
struct Organization;

#[replicated_model(scope = Organization, id = 1, table = "members", shard = organization_id, fan_out)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Member {
    id: i64,
    organization_id: i64,
}

async fn add(pool: &sqlx::SqlitePool, member: &Member) -> Result<(), outbox_core::Error> {
    let mut tx = pool.begin().await.expect("begin");
    outbox_sqlite::save(&mut tx, member).await?;
    tx.commit().await.expect("commit");
    Ok(())
}

fn main() {}
