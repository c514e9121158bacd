//! The handler crate is named in source, so it is linked: `Registry::discover()` finds its
//! handler, and a relay delivers to it.

use std::sync::mpsc;

use linking_categories::ProjectRenamed;
// The whole point of this file: naming the crate links it, and with it its `#[outbox_handler]`.
use linking_handlers as _;
use outbox_core::error::RegistryProblem;
use outbox_core::{Category, Error, Message, Registry, Relay};

#[test]
fn discover_finds_the_handler() {
    let (sender, _receiver) = mpsc::channel::<ProjectRenamed>();
    let registry = Registry::builder()
        .discovered()
        .state(sender)
        .build()
        .expect("the handler crate is linked");
    let info = registry
        .category(ProjectRenamed::ID)
        .expect("the category is declared");
    assert_eq!(info.identity.name, ProjectRenamed::NAME);
    assert!(!info.no_op, "{info:?}");
    assert_eq!(registry.category_ids(), [ProjectRenamed::ID]);
}

/// The handler in the other crate takes `State<Sender<ProjectRenamed>>`: a binary that gives
/// none does not start, and the refusal names the category, the handler and the state's type.
#[test]
fn a_state_the_linked_handler_takes_must_be_given() {
    let error = Registry::discover().expect_err("no Sender was given");
    let Error::Registry { problems } = &error else {
        panic!("expected a registry error, got {error:?}");
    };
    let [
        RegistryProblem::MissingState {
            category,
            handler,
            state_type,
        },
    ] = problems.as_slice()
    else {
        panic!("expected exactly one MissingState problem, got {problems:?}");
    };
    assert_eq!(category.name, ProjectRenamed::NAME);
    assert_eq!(
        *state_type,
        std::any::type_name::<mpsc::Sender<ProjectRenamed>>()
    );
    assert_eq!(
        handler.expect("the handler's place").file,
        "tests/linking/handlers/src/lib.rs"
    );
    let text = error.to_string();
    assert!(
        text.contains("takes `State<std::sync::mpsc::Sender<")
            && text.contains("`project_renamed`"),
        "{text}"
    );
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
