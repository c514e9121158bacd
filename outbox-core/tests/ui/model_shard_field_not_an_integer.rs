use outbox_core::{outbox_scope, replicated_model};

#[outbox_scope(id = 1)]
struct Organization;

#[replicated_model(scope = Organization, id = 1, table = "projects", shard = organization)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Project {
    id: i64,
    organization: String,
    name: String,
}

fn main() {}
