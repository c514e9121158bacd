// A service's declarations, included by both path tests after each imports the macros and
// types from where its `Cargo.toml` puts the engine: what differs is only that path.

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
