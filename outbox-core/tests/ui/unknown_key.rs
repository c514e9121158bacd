use outbox_core::{outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1, coalesced = false)]
#[derive(serde::Serialize, serde::Deserialize)]
struct AuditEntry {
    action: String,
}

fn main() {}
