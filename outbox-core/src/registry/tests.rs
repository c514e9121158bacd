//! The registry's checks, on categories written by hand.

use super::Registry;
use crate::error::{Error, RegistryProblem};
use crate::handler::{Deletion, Replication};
use crate::handler::{Delivery, NoOp};
use crate::model::{Category, CategoryId, Scope, ScopeId};
use crate::replicated::ReplicatedModel;
use crate::test_models::{Org, Thing};

macro_rules! category {
    ($name:ident, $scope:ident, $id:expr, $label:expr) => {
        struct $name;
        impl Category for $name {
            type Scope = $scope;
            type Payload = ();
            const ID: CategoryId = CategoryId($id);
            const NAME: &'static str = $label;
        }
    };
}
struct Impostor;
impl Scope for Impostor {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "impostor";
}
category!(First, Org, 1, "first");
category!(SameId, Org, 1, "same_id");
category!(SameName, Org, 2, "first");
category!(OtherScope, Impostor, 3, "other_scope");

/// `(kind, first name, first id, second name, second id)` of each problem.
fn summary(error: &Error) -> Vec<(&'static str, &'static str, i64, &'static str, i64)> {
    let Error::Registry { problems } = error else {
        panic!("{error:?}")
    };
    problems
        .iter()
        .map(|problem| match problem {
            RegistryProblem::DuplicateCategoryId { first, second } => {
                ("id", first.name, first.id, second.name, second.id)
            }
            RegistryProblem::DuplicateCategoryName { first, second } => {
                ("name", first.name, first.id, second.name, second.id)
            }
            RegistryProblem::DuplicateScopeId { first, second } => {
                ("scope", first.name, first.id, second.name, second.id)
            }
            RegistryProblem::DuplicateHandler { category, .. } => {
                ("handlers", category.name, category.id, "", 0)
            }
            RegistryProblem::MissingHandler { category, .. } => {
                ("missing", category.name, category.id, "", 0)
            }
            RegistryProblem::UndeclaredCategory { category } => {
                ("undeclared", category.name, category.id, "", 0)
            }
            RegistryProblem::MissingModelHandler { category, kind, .. } => {
                ("missing model", category.name, category.id, *kind, 0)
            }
            RegistryProblem::DeliveryHandlerForModel { category, .. } => {
                ("delivery for model", category.name, category.id, "", 0)
            }
            RegistryProblem::MissingState {
                category,
                state_type,
                ..
            } => ("state", category.name, category.id, *state_type, 0),
            RegistryProblem::ZeroMaxAttempts { category } => {
                ("zero attempts", category.name, category.id, "", 0)
            }
            RegistryProblem::PolicyForUnknownCategory { category } => {
                ("policy", category.name, category.id, "", 0)
            }
        })
        .collect()
}

/// A category declaring its dead-letter policy, as `max_attempts = 3` would.
struct Retried;
impl Category for Retried {
    type Scope = Org;
    type Payload = ();
    const ID: CategoryId = CategoryId(7);
    const NAME: &'static str = "retried";
    const MAX_ATTEMPTS: Option<u32> = Some(3);
}

#[test]
fn dead_letter_policies_come_from_the_category_and_the_builder_overrides_them() {
    let policy = |registry: &Registry, id| {
        registry
            .category(CategoryId(id))
            .unwrap()
            .identity
            .max_attempts
    };
    let declared = Registry::builder()
        .no_op::<First>()
        .no_op::<Retried>()
        .build()
        .unwrap();
    assert_eq!(policy(&declared, 1), None, "blocks by default");
    assert_eq!(policy(&declared, 7), Some(3), "as declared");

    let overridden = Registry::builder()
        .no_op::<First>()
        .no_op::<Retried>()
        .max_attempts::<First>(5)
        .block_on_failure::<Retried>()
        .build()
        .unwrap();
    assert_eq!(policy(&overridden, 1), Some(5));
    assert_eq!(policy(&overridden, 7), None);

    // The last word wins.
    let twice = Registry::builder()
        .no_op::<Retried>()
        .max_attempts::<Retried>(1)
        .max_attempts::<Retried>(9)
        .build()
        .unwrap();
    assert_eq!(policy(&twice, 7), Some(9));
}

#[test]
fn a_policy_of_no_attempts_or_for_a_stranger_is_refused() {
    let error = Registry::builder()
        .no_op::<First>()
        .max_attempts::<First>(0)
        .max_attempts::<SameName>(2)
        .build()
        .unwrap_err();
    assert_eq!(
        summary(&error),
        [
            ("zero attempts", "first", 1, "", 0),
            ("policy", "first", 2, "", 0),
        ]
    );
    let text = error.to_string();
    assert!(
        text.contains(
            "`max_attempts` for category `first` (id 1, at outbox-core/src/registry/tests.rs:"
        ),
        "{text}"
    );
}

#[test]
fn every_conflict_is_reported_at_once() {
    let error = Registry::builder()
        .no_op::<First>()
        .no_op::<SameId>()
        .no_op::<SameName>()
        .no_op::<OtherScope>()
        .build()
        .unwrap_err();
    assert_eq!(
        summary(&error),
        [
            ("scope", "org", 1, "impostor", 1),
            ("id", "first", 1, "same_id", 1),
            ("name", "first", 1, "first", 2),
        ]
    );
    let text = error.to_string();
    assert!(
        text.contains(
            "two categories use id 1: `first` (id 1, at outbox-core/src/registry/tests.rs:"
        ) && text.contains("`org` (id 1) and `impostor` (id 1)"),
        "{text}"
    );
}

#[test]
fn two_handlers_for_one_category_are_refused_with_both_places() {
    let error = Registry::builder()
        .no_op::<First>()
        .handle::<First>(NoOp)
        .build()
        .unwrap_err();
    assert_eq!(summary(&error), [("handlers", "first", 1, "", 0)]);
    let Error::Registry { problems } = &error else {
        unreachable!()
    };
    let RegistryProblem::DuplicateHandler { first, second, .. } = &problems[0] else {
        unreachable!()
    };
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.file, file!());
    assert_eq!(second.line, first.line + 1, "each registration's own line");
}

async fn ok<T>(_: T) -> Result<(), BoxErrorAlias> {
    Ok(())
}
type BoxErrorAlias = crate::BoxError;

#[test]
fn a_model_needs_one_replication_and_one_deletion_handler() {
    let registry = Registry::builder()
        .replication::<Thing>(ok::<Replication<Thing>>)
        .deletion::<Thing>(ok::<Deletion<Thing>>)
        .build()
        .unwrap();
    let info = registry.category(Thing::ID).unwrap();
    assert_eq!(info.model, Some(Thing::TABLE));

    let error = Registry::builder()
        .replication::<Thing>(ok::<Replication<Thing>>)
        .replication::<Thing>(ok::<Replication<Thing>>)
        .handle::<Thing>(NoOp)
        .build()
        .unwrap_err();
    assert_eq!(
        summary(&error),
        [
            ("handlers", "thing", 30, "", 0),
            ("delivery for model", "thing", 30, "", 0),
            ("missing model", "thing", 30, "Deletion", 0),
        ]
    );
    let text = error.to_string();
    assert!(
        text.contains(
            "has no Deletion handler: add an `#[outbox_handler]` async fn taking \
             `Deletion<Thing>`, or call `Registry::builder().deletion::<Thing>(..)`"
        ) && text.contains("is a replicated model: its handlers take `Replication<_>`"),
        "{text}"
    );
}

#[derive(Clone)]
struct Pool;
#[derive(Clone)]
struct Client;

async fn takes_states(
    _: Delivery<First>,
    _: crate::State<Pool>,
    _: crate::State<Client>,
) -> Result<(), BoxErrorAlias> {
    Ok(())
}

#[test]
fn a_state_a_handler_takes_and_nobody_gave_is_refused_naming_both() {
    let error = Registry::builder()
        .state(Client)
        .handle::<First>(crate::handler::handler_fn(takes_states))
        .build()
        .unwrap_err();
    let pool = std::any::type_name::<Pool>();
    assert_eq!(summary(&error), [("state", "first", 1, pool, 0)]);
    let Error::Registry { problems } = &error else {
        unreachable!()
    };
    let RegistryProblem::MissingState { handler, .. } = &problems[0] else {
        unreachable!()
    };
    assert_eq!(handler.map(|at| at.file), Some(file!()));
    let text = error.to_string();
    assert!(
        text.contains("the handler of category `first` (id 1")
            && text.contains(&format!("takes `State<{pool}>`, but no `{pool}` was given")),
        "{text}"
    );

    let both = Registry::builder()
        .state(Pool)
        .state(Client)
        .handle::<First>(crate::handler::handler_fn(takes_states))
        .build();
    assert!(both.is_ok(), "{both:?}");
}

#[test]
fn lookups_know_scope_and_policy() {
    let registry = Registry::builder().no_op::<First>().build().unwrap();
    let info = registry.category(CategoryId(1)).unwrap();
    assert_eq!(
        (
            info.identity.name,
            info.identity.scope,
            info.identity.scope_name,
            info.identity.coalesce,
            info.no_op
        ),
        ("first", ScopeId(1), "org", true, true)
    );
    assert!(registry.category(CategoryId(2)).is_none());
    assert_eq!(registry.category_ids(), [CategoryId(1)]);
}
