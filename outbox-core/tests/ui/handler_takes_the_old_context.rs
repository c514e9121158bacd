use outbox_core::{BoxError, Delivery, outbox_category, outbox_handler, outbox_scope};
use outbox_core::handler::{HandlerContext};

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[outbox_handler]
async fn replicate(
    update: Delivery<ProjectUpdate>,
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    let _ = (update.payload.name, cx);
    Ok(())
}

fn main() {}
