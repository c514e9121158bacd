//! Handlers take what they need as arguments: closures through `handler_fn` and hand-written
//! handler types, delivered by a relay on the in-memory store.

use outbox_core::handler::{ExtractError, Handler, HandlerContext, Requirements, handler_fn};
use outbox_core::memory::MemoryStore;
use outbox_core::{
    BoxError, Category, CategoryId, Connection, Delivery, DeliveryError, Message, Registry, Relay,
    Scope, ScopeId, State,
};

mod common;
use common::Seen;

struct Org;
impl Scope for Org {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "org";
}

struct Renamed;
impl Category for Renamed {
    type Scope = Org;
    type Payload = String;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "renamed";
}

/// A second state, to see that each argument gets its own.
#[derive(Debug, Clone)]
struct Prefix(&'static str);

fn store_with(names: &[&str]) -> MemoryStore {
    let store = MemoryStore::new();
    for (object, name) in (1..).zip(names) {
        store.write(&Message::new::<Renamed>(7, object, &(*name).to_owned()).expect("a message"));
    }
    store
}

#[tokio::test]
async fn a_closure_takes_the_states_given_to_the_registry() {
    let seen = Seen::default();
    let registry = Registry::builder()
        .state(seen.clone())
        .state(Prefix("renamed to"))
        .handle::<Renamed>(handler_fn(
            |renamed: Delivery<Renamed>, State(seen): State<Seen>, prefix: State<Prefix>| async move {
                seen.push(format!("{} {} {}", renamed.object_identifier, prefix.0.0, renamed.payload));
                Ok::<(), BoxError>(())
            },
        ))
        .build()
        .expect("both states are given");
    let report = Relay::new(store_with(&["a", "b"]), registry)
        .drain()
        .await
        .expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(seen.lines(), ["1 renamed to a", "2 renamed to b"]);
}

#[test]
fn a_closure_taking_a_state_nobody_gave_is_refused() {
    let error = Registry::builder()
        .state(Seen::default())
        .handle::<Renamed>(handler_fn(
            |_: Delivery<Renamed>, _: State<Seen>, _: State<Prefix>| async {
                Ok::<(), BoxError>(())
            },
        ))
        .build()
        .expect_err("no Prefix was given");
    let text = error.to_string();
    assert!(
        text.contains("the handler of category `renamed` (id 1")
            && text.contains("takes `State<handlers::Prefix>`")
            && !text.contains("State<handlers::Seen>"),
        "{text}"
    );
}

/// A handler type of its own: it declares the state it takes, and makes it from the context.
struct Counting;

impl Handler<Delivery<Renamed>> for Counting {
    fn requires(&self, requirements: &mut Requirements) {
        requirements.state::<Seen>();
    }

    async fn call(
        &self,
        delivery: Delivery<Renamed>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let State(seen) = <State<Seen> as outbox_core::handler::FromContext<'_>>::from_context(cx)?;
        seen.push(delivery.payload);
        Ok(())
    }
}

#[tokio::test]
async fn a_handler_type_declares_and_takes_its_state() {
    assert!(
        Registry::builder()
            .handle::<Renamed>(Counting)
            .build()
            .is_err(),
        "its declared state is checked"
    );
    let seen = Seen::default();
    let registry = Registry::builder()
        .state(seen.clone())
        .handle::<Renamed>(Counting)
        .build()
        .expect("the state is given");
    Relay::new(store_with(&["a"]), registry)
        .drain()
        .await
        .expect("drain");
    assert_eq!(seen.lines(), ["a"]);
}

/// A handler asking for the claiming transaction's connection when the relay runs handlers under
/// a lease: the delivery fails with a typed error saying so, and the shard keeps its row.
struct WantsConnection;

impl Handler<Delivery<Renamed>> for WantsConnection {
    async fn call(
        &self,
        _delivery: Delivery<Renamed>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let _connection =
            <Connection<'_, String> as outbox_core::handler::FromContext<'_>>::from_context(cx)?;
        Ok(())
    }
}

#[tokio::test]
async fn a_connection_outside_transaction_mode_is_a_typed_failure() {
    let registry = Registry::builder()
        .handle::<Renamed>(WantsConnection)
        .build()
        .expect("registry");
    let store = store_with(&["a"]);
    let report = Relay::new(store.clone(), registry)
        .drain()
        .await
        .expect("drain");
    let [failure] = report.failures.as_slice() else {
        panic!("expected one failure: {report:?}");
    };
    let DeliveryError::Extract {
        category, source, ..
    } = &failure.error
    else {
        panic!("expected an extraction failure: {:?}", failure.error);
    };
    assert_eq!(*category, "renamed");
    assert_eq!(
        *source,
        ExtractError::NoConnection {
            type_name: "alloc::string::String",
            in_transaction: false
        }
    );
    assert!(
        source.to_string().contains("HandlerMode::InTransaction"),
        "{source}"
    );
    assert_eq!(store.pending().len(), 1, "nothing acknowledged");
}
