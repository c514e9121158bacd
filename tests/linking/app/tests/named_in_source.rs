//! The handler crate is named in source, so it is linked: `Registry::discover()` finds its
//! handler, and a relay delivers to it.

use std::sync::mpsc;

use linking_categories::ProjectRenamed;
// The whole point of this file: naming the crate links it, and with it its `#[outbox_handler]`.
use linking_handlers as _;
use outbox_core::{Category, Message, Registry, Relay};

#[test]
fn discover_finds_the_handler() {
    let registry = Registry::discover().expect("the handler crate is linked");
    let info = registry
        .category(ProjectRenamed::ID)
        .expect("the category is declared");
    assert_eq!(info.name, ProjectRenamed::NAME);
    assert!(!info.no_op, "{info:?}");
    assert_eq!(registry.category_ids(), [ProjectRenamed::ID]);
}

#[tokio::test]
async fn the_handler_receives_a_delivery() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let pool = outbox_sqlite::connect(&dir.path().join("outbox.db"))
        .await
        .expect("open");
    outbox_sqlite::migrate(&pool).await.expect("migrate");
    let renamed = ProjectRenamed {
        name: "apollo".into(),
    };
    outbox_sqlite::write(
        &pool,
        &Message::new::<ProjectRenamed>(1, 7, &renamed).unwrap(),
    )
    .await
    .expect("write");

    let (sender, receiver) = mpsc::channel::<ProjectRenamed>();
    let registry = Registry::builder()
        .discovered()
        .state(sender)
        .build()
        .expect("registry");
    let report = Relay::new(outbox_sqlite::SqliteStore::new(pool), registry)
        .drain()
        .await
        .expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 1);
    assert_eq!(receiver.try_iter().collect::<Vec<_>>(), [renamed]);
}
