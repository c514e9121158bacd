use outbox_core::{outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

mod v2 {
    use super::Organization;
    use outbox_core::outbox_category;

    #[outbox_category(scope = Organization, id = 2)]
    #[derive(serde::Serialize, serde::Deserialize)]
    struct ProjectUpdate {
        name: String,
    }
}

fn main() {}
