use outbox_core::{outbox_category, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 7)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

mod teams {
    use super::Organization;
    use outbox_core::outbox_category;

    #[outbox_category(scope = Organization, id = 7)]
    #[derive(serde::Serialize, serde::Deserialize)]
    struct TeamUpdate {
        name: String,
    }
}

fn main() {}
