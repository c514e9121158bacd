use outbox_core::{Delivery, Message, outbox_category, outbox_handler, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

// One mistake (no scope): one error, not one more at each use of the category below.
#[outbox_category(id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[outbox_handler]
async fn replicate(delivery: Delivery<ProjectUpdate>) -> Result<(), std::io::Error> {
    let _ = delivery.payload.name;
    Ok(())
}

fn write() -> Result<Message, outbox_core::Error> {
    Message::new::<ProjectUpdate>(1, 1, &ProjectUpdate { name: "api".into() })
}

fn main() {}
