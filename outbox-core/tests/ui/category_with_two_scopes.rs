use outbox_core::{outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_scope(id = 2)]
struct User;

#[outbox_category(scope = Organization, scope = User, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

fn main() {}
