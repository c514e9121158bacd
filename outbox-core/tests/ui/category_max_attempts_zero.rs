use outbox_core::{outbox_categories, outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

// No attempt at all would set every failing group aside unseen: leave the key out instead.
#[outbox_category(scope = Organization, id = 1, max_attempts = 0)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Renamed {
    name: String,
}

#[outbox_categories(scope = Organization)]
enum OrgEvent {
    #[category(id = 2, max_attempts = -1)]
    Renamed(Renamed),
}

fn main() {}
