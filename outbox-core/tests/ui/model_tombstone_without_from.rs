use outbox_core::{outbox_scope, replicated_model};

#[outbox_scope(id = 1)]
struct Organization;

#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectTombstone {
    name: String,
}

#[replicated_model(
    scope = Organization,
    id = 1,
    table = "projects",
    shard = organization_id,
    tombstone = ProjectTombstone
)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
    name: String,
}

fn main() {}
