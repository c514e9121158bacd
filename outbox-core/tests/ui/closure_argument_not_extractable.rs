use outbox_core::{BoxError, Delivery, Registry, outbox_category, outbox_scope};
use outbox_core::handler::{handler_fn};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[derive(Clone)]
struct Pool;

fn main() {
    let _ = Registry::builder().handle::<ProjectUpdate>(handler_fn(
        |update: Delivery<ProjectUpdate>, pool: Pool| async move {
            let _ = (update.payload.name, pool);
            Ok::<(), BoxError>(())
        },
    ));
}
