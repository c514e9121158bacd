//! A service's declarations, with the engine renamed `engine` in its `Cargo.toml`.

use engine::{BoxError, Delivery, outbox_category, outbox_handler, outbox_scope};
use serde::{Deserialize, Serialize};

/// The scope the messages are sharded by.
#[outbox_scope(id = 1)]
pub struct Team;

/// A team was renamed.
#[outbox_category(scope = Team, id = 1)]
#[derive(Debug, Serialize, Deserialize)]
pub struct TeamRenamed {
    /// The new name.
    pub name: String,
}

/// Checks what it is handed.
#[outbox_handler]
async fn renamed(delivery: Delivery<TeamRenamed>) -> Result<(), BoxError> {
    if delivery.payload.name.is_empty() {
        return Err("a team needs a name".into());
    }
    Ok(())
}
