//! A scope's categories declared together as one enum (`#[outbox_categories]`): each variant's
//! payload type is a category, and one handler taking `Delivery<TheEnum>` receives every
//! variant, in the shard's order, and `match`es them exhaustively.

use outbox_core::error::RegistryProblem;
use outbox_core::memory::MemoryStore;
use outbox_core::{
    BoxError, Category, CategoryId, Delivery, Error, Message, Registry, Relay, State,
    outbox_categories, outbox_handler, outbox_scope,
};
use serde::{Deserialize, Serialize};

mod common;
use common::Seen;

#[outbox_scope(id = 1)]
struct Organization;

#[derive(Debug, Serialize, Deserialize)]
struct Renamed {
    name: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct MemberAdded {
    user: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Archived;

/// Everything that happens to an organization.
#[outbox_categories(scope = Organization)]
#[derive(Debug)]
enum OrgEvent {
    #[category(id = 1)]
    Renamed(Renamed),
    #[category(id = 2, name = "member_added", coalesce = false, max_attempts = 3)]
    MemberAdded(MemberAdded),
    /// Other attributes of a variant are kept.
    #[category(id = 3, name = "organization_archived")]
    Archived(Archived),
}

/// One handler for the whole scope: a `match` the compiler checks is exhaustive.
#[outbox_handler]
async fn on_organization(
    event: Delivery<OrgEvent>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let line = match event.payload {
        OrgEvent::Renamed(Renamed { name }) => format!("renamed to {name}"),
        OrgEvent::MemberAdded(MemberAdded { user }) => format!("member {user} added"),
        OrgEvent::Archived(Archived) => "archived".to_owned(),
    };
    seen.push(format!("{} {line}", event.object_identifier));
    Ok(())
}

#[test]
fn each_variant_is_a_category_of_the_scope() {
    assert_eq!(
        (Renamed::ID, Renamed::NAME, Renamed::COALESCE),
        (CategoryId(1), "renamed", true)
    );
    assert_eq!(
        (MemberAdded::ID, MemberAdded::NAME, MemberAdded::COALESCE),
        (CategoryId(2), "member_added", false)
    );
    assert_eq!(
        (Renamed::MAX_ATTEMPTS, MemberAdded::MAX_ATTEMPTS),
        (None, Some(3)),
        "each variant's own dead-letter policy"
    );
    assert_eq!(
        (Archived::ID, Archived::NAME),
        (CategoryId(3), "organization_archived")
    );
    let refused = Registry::discover().expect_err("the handler takes a Seen");
    let Error::Registry { problems } = &refused else {
        panic!("{refused:?}")
    };
    assert!(
        matches!(problems.as_slice(), [RegistryProblem::MissingState { .. }]),
        "the one handler's state is reported once: {problems:?}"
    );
    let registry = Registry::builder()
        .discovered()
        .state(Seen::default())
        .build()
        .expect("one handler covers the three categories");
    let declared: Vec<_> = registry
        .categories()
        .iter()
        .map(|info| {
            (
                info.identity.id.0,
                info.identity.name,
                info.identity.scope_name,
                info.no_op,
            )
        })
        .collect();
    assert_eq!(
        declared,
        [
            (1, "renamed", "organization", false),
            (2, "member_added", "organization", false),
            (3, "organization_archived", "organization", false),
        ]
    );
}

fn write_events(store: &MemoryStore) {
    let renamed = |name: &str| Renamed { name: name.into() };
    store.write(&Message::new::<Renamed>(7, 1, &renamed("Acme")).unwrap());
    store.write(&Message::new::<MemberAdded>(7, 2, &MemberAdded { user: 10 }).unwrap());
    store.write(&Message::new::<Archived>(7, 3, &Archived).unwrap());
    store.write(&Message::new::<MemberAdded>(7, 2, &MemberAdded { user: 11 }).unwrap());
    store.write(&Message::new::<Renamed>(7, 1, &renamed("Acme Corp")).unwrap());
}

#[tokio::test]
async fn one_enum_handler_receives_every_variant_in_order() {
    let store = MemoryStore::new();
    write_events(&store);
    let seen = Seen::default();
    let registry = Registry::builder()
        .discovered()
        .state(seen.clone())
        .build()
        .expect("registry");
    let report = Relay::new(store, registry).drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        seen.lines(),
        [
            // The renames coalesce to the newest; members added are each delivered.
            "1 renamed to Acme Corp",
            "2 member 10 added",
            "3 archived",
            "2 member 11 added",
        ]
    );
}

#[tokio::test]
async fn a_closure_handles_the_enum_too() {
    let store = MemoryStore::new();
    write_events(&store);
    let seen = Seen::default();
    let recorded = seen.clone();
    let registry = Registry::builder()
        .handle::<OrgEvent>(move |event: Delivery<OrgEvent>| {
            recorded.push(format!("{:?}", event.payload));
            async { Ok::<(), BoxError>(()) }
        })
        .build()
        .expect("registry");
    assert_eq!(
        registry.category_ids(),
        [CategoryId(1), CategoryId(2), CategoryId(3)]
    );
    Relay::new(store, registry).drain().await.expect("drain");
    assert_eq!(seen.lines().len(), 4, "{:?}", seen.lines());
    assert!(seen.lines()[0].starts_with("Renamed"), "{:?}", seen.lines());
}
