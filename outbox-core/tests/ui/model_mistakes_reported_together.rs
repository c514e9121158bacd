use outbox_core::{outbox_scope, replicated_model};

#[outbox_scope(id = 1)]
struct Organization;

// Two mistakes, two errors, each at its own token: a misspelled key (not also reported as the
// missing `table` it was meant to be), and a shard field the struct does not have.
#[replicated_model(scope = Organization, id = 1, tabel = "projects", shard = org_id)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
}

fn main() {}
