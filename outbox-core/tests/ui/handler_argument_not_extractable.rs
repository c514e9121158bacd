use outbox_core::{BoxError, Delivery, outbox_category, outbox_handler, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[derive(Clone)]
struct Pool;

// The pool is a state: the handler should take `State<Pool>`.
#[outbox_handler]
async fn replicate(update: Delivery<ProjectUpdate>, pool: Pool) -> Result<(), BoxError> {
    let _ = (update.payload.name, pool);
    Ok(())
}

fn main() {}
