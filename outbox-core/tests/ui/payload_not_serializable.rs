use outbox_core::{outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
struct ProjectUpdate {
    name: String,
}

fn main() {}
