use outbox_core::outbox_category;

#[outbox_category(scope = String, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

fn main() {}
