//! The declaration macros as a user writes them: scopes, categories and handlers declared with
//! attributes, found by `Registry::discover()`, and delivered by a relay.

use std::sync::{Mutex, PoisonError};

use outbox_core::error::RegistryProblem;
use outbox_core::memory::MemoryStore;
use outbox_core::{
    BoxError, Category, CategoryId, Delivery, Error, Message, Registry, Relay, Scope, ScopeId,
    State, outbox_category, outbox_handler, outbox_scope,
};
use serde::{Deserialize, Serialize};

mod common;
use common::Seen;

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_scope(id = 2, name = "audit")]
struct AuditLog;

#[outbox_category(scope = Organization, id = 10)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProjectUpdate {
    name: String,
}

#[outbox_category(
    scope = AuditLog,
    id = 11,
    name = "audit_entry",
    coalesce = false,
    max_attempts = 5
)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AuditEntry {
    action: String,
}

#[outbox_category(scope = Organization, id = 12, no_op)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheHint;

#[outbox_handler]
async fn replicate_project(
    delivery: Delivery<ProjectUpdate>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    seen.push(format!(
        "project {} {}",
        delivery.object_identifier, delivery.payload.name
    ));
    Ok(())
}

static AUDITED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[outbox_handler]
async fn record_audit(delivery: Delivery<AuditEntry>) -> Result<(), std::io::Error> {
    AUDITED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(delivery.payload.action);
    Ok(())
}

#[test]
fn declarations_implement_the_traits() {
    assert_eq!(Organization::ID, ScopeId(1));
    assert_eq!(Organization::NAME, "organization");
    assert_eq!(AuditLog::NAME, "audit");
    assert_eq!(ProjectUpdate::ID, CategoryId(10));
    assert_eq!(ProjectUpdate::NAME, "project_update");
    assert_eq!(
        (ProjectUpdate::COALESCE, AuditEntry::COALESCE),
        (true, false)
    );
    assert_eq!(AuditEntry::NAME, "audit_entry");
    assert_eq!(<AuditEntry as Category>::Scope::ID, ScopeId(2));
}

/// `replicate_project` takes `State<Seen>`: without a `Seen`, the binary does not start, and the
/// refusal names the handler's category, its place and the state's type.
#[test]
fn an_attribute_handler_taking_a_state_nobody_gave_is_refused() {
    let error = Registry::discover().expect_err("no Seen was given");
    let Error::Registry { problems } = &error else {
        panic!("{error:?}")
    };
    let [
        RegistryProblem::MissingState {
            category,
            handler,
            state_type,
        },
    ] = problems.as_slice()
    else {
        panic!("expected one MissingState problem, got {problems:?}");
    };
    assert_eq!(category.name, ProjectUpdate::NAME);
    assert_eq!(*state_type, std::any::type_name::<Seen>());
    assert_eq!(handler.map(|at| at.file), Some(file!()));
    assert!(
        error
            .to_string()
            .contains("takes `State<macros::common::Seen>`"),
        "{error}"
    );
    assert_eq!(
        error.to_string().matches("tests/macros.rs:").count(),
        1,
        "the handler's place, once: {error}"
    );
}

#[test]
fn discover_finds_every_declaration_with_its_handler() {
    let registry = Registry::builder()
        .discovered()
        .state(Seen::default())
        .build()
        .expect("the declarations are consistent");
    let summary: Vec<_> = registry
        .categories()
        .iter()
        .map(|info| {
            (
                info.identity.id.0,
                info.identity.name,
                info.identity.scope_name,
                info.identity.coalesce,
                info.no_op,
                info.identity.max_attempts,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (10, "project_update", "organization", true, false, None),
            (11, "audit_entry", "audit", false, false, Some(5)),
            (12, "cache_hint", "organization", true, true, None),
        ]
    );
    assert_eq!(AuditEntry::MAX_ATTEMPTS, Some(5));
}

#[test]
fn a_second_handler_is_refused_naming_both_places() {
    let error = Registry::builder()
        .discovered()
        .handle::<ProjectUpdate>(|_: Delivery<ProjectUpdate>| async { Ok::<_, BoxError>(()) })
        .build()
        .expect_err("two handlers for project_update");
    let text = error.to_string();
    assert!(
        text.contains("category `project_update` (id 10, at outbox-core/tests/macros.rs:")
            && text.contains("has two handlers: at outbox-core/tests/macros.rs:"),
        "{text}"
    );
}

#[test]
fn a_handler_for_an_undeclared_category_is_refused() {
    struct Undeclared;
    impl Category for Undeclared {
        type Scope = Organization;
        type Payload = ();
        const ID: CategoryId = CategoryId(99);
        const NAME: &'static str = "undeclared";
    }
    let error = Registry::builder()
        .discovered()
        .no_op::<Undeclared>()
        .build()
        .expect_err("undeclared");
    assert!(
        error
            .to_string()
            .contains("a handler is registered for category `undeclared` (id 99, at outbox-core/tests/macros.rs:"),
        "{error}"
    );
}

#[tokio::test]
async fn declared_handlers_deliver() {
    let store = MemoryStore::new();
    let messages = [
        Message::new::<ProjectUpdate>(1, 7, &ProjectUpdate { name: "v1".into() }).unwrap(),
        Message::new::<ProjectUpdate>(1, 7, &ProjectUpdate { name: "v2".into() }).unwrap(),
        Message::new::<AuditEntry>(
            1,
            1,
            &AuditEntry {
                action: "create".into(),
            },
        )
        .unwrap(),
        Message::new::<AuditEntry>(
            1,
            1,
            &AuditEntry {
                action: "rename".into(),
            },
        )
        .unwrap(),
        Message::new::<CacheHint>(1, 7, &CacheHint).unwrap(),
    ];
    store.write_all(&messages);

    let seen = Seen::default();
    let registry = Registry::builder()
        .discovered()
        .state(seen.clone())
        .build()
        .expect("registry");
    let report = Relay::new(store, registry).drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 5);
    assert_eq!(seen.lines(), ["project 7 v2"]);
    assert_eq!(
        *AUDITED.lock().unwrap_or_else(PoisonError::into_inner),
        ["create", "rename"]
    );
}
