use outbox_core::{Delivery, outbox_category, outbox_handler, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[outbox_handler]
async fn replicate(delivery: Delivery<ProjectUpdate>) -> bool {
    !delivery.payload.name.is_empty()
}

fn main() {}
