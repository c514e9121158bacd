//! Declarations made under a renamed engine are registered and delivered.

use engine::memory::MemoryStore;
use engine::{BoxError, Message, Registry, Relay};
use paths_renamed::TeamRenamed;

#[tokio::test(flavor = "current_thread")]
async fn a_message_declared_under_a_renamed_engine_is_delivered() -> Result<(), BoxError> {
    let store = MemoryStore::new();
    let renamed = TeamRenamed {
        name: "platform".into(),
    };
    store.write(&Message::new::<TeamRenamed>(7, 7, &renamed)?);
    let relay = Relay::new(store, Registry::discover()?);
    let report = relay.drain().await?;
    assert_eq!(report.rows_acknowledged, 1);
    Ok(())
}
