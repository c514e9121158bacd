use outbox_core::outbox_category;

#[outbox_category(id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

fn main() {}
