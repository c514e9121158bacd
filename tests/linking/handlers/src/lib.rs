//! The handler crate of the linking test: the `#[outbox_handler]` of
//! [`linking_categories::ProjectRenamed`], and nothing public. A binary has this handler only if
//! the crate is linked into it, which naming the crate in source (`use linking_handlers as _;`)
//! guarantees and a Cargo.toml dependency alone does not.

use std::sync::mpsc::Sender;

use linking_categories::ProjectRenamed;
use outbox_core::{BoxError, Delivery, State, outbox_handler};

/// Sends each delivered payload to the `Sender<ProjectRenamed>` given as the registry's state, so
/// that a test can see the handler ran without naming anything in this crate.
#[outbox_handler]
async fn forward_project_renamed(
    delivery: Delivery<ProjectRenamed>,
    State(sender): State<Sender<ProjectRenamed>>,
) -> Result<(), BoxError> {
    sender.send(delivery.payload)?;
    Ok(())
}
