//! `#[outbox_category(..., sink = K)]`: the category's handler is the sink of type `K` given to
//! the registry as a state.

use outbox_core::{Error, Message, Registry, Relay, outbox_category, outbox_scope};

use outbox_core::error::RegistryProblem;
use outbox_testkit::StoreBackend;
use outbox_testkit::sink::MemorySink;
use outbox_testkit::sqlite::SqliteBackend;
use serde::{Deserialize, Serialize};

#[outbox_scope(id = 1)]
struct Warehouse;

/// Published through the `MemorySink` of the registry's state.
#[outbox_category(scope = Warehouse, id = 1, coalesce = false, sink = MemorySink)]
#[derive(Debug, Serialize, Deserialize)]
struct Shipped {
    parcel: i64,
}

#[tokio::test]
async fn a_declared_sink_publishes_its_category() {
    let backend = SqliteBackend::create().await;
    let sink = MemorySink::new();
    let registry = Registry::builder()
        .discovered()
        .state(sink.clone())
        .build()
        .expect("the declared sink is in the state");
    let relay = Relay::new(backend.store(), registry);
    let ids = backend
        .write(&[
            Message::new::<Shipped>(3, 1, &Shipped { parcel: 1 }).expect("a message"),
            Message::new::<Shipped>(3, 2, &Shipped { parcel: 2 }).expect("a message"),
        ])
        .await
        .expect("write");
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let published = sink.published();
    let keys: Vec<(&str, &str, &str)> = published
        .iter()
        .map(|envelope| {
            (
                envelope.destination.as_str(),
                envelope.key.as_str(),
                envelope.dedup_key.as_str(),
            )
        })
        .collect();
    let (first, second) = (ids[0].0.to_string(), ids[1].0.to_string());
    assert_eq!(
        keys,
        [
            ("outbox.shipped", "1:3", first.as_str()),
            ("outbox.shipped", "1:3", second.as_str())
        ]
    );
}

#[test]
fn a_declared_sink_missing_from_the_state_is_refused_at_build() {
    let Err(Error::Registry { problems }) = Registry::builder().discovered().build() else {
        panic!("a registry without the declared sink builds");
    };
    assert!(
        problems.iter().any(|problem| matches!(
            problem,
            RegistryProblem::MissingState { state_type, .. } if state_type.contains("MemorySink")
        )),
        "{problems:?}"
    );
}
