use outbox_core::{Replication, outbox_category, outbox_handler, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[outbox_handler]
async fn replicate(replication: Replication<ProjectUpdate>) -> Result<(), std::io::Error> {
    let _ = replication;
    Ok(())
}

fn main() {}
