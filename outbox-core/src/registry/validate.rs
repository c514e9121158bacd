//! The checks [`RegistryBuilder::build`](super::RegistryBuilder::build) runs, each a step that
//! adds what it finds to one list, so that every problem is reported at once: states the
//! handlers take, scope ids, category ids and names, and exactly one handler per category.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::builder::{Declared, HandlerEntry, Role};
use super::lookup::CategoryInfo;
use crate::error::SourceLocation;
use crate::error::{RegistryProblem, Site};
use crate::handler::ModelDispatch;
use crate::handler::StateMap;
use crate::handler::{ErasedHandler, NoOpErased};
use crate::model::{CategoryId, ScopeId};

/// What was given to the builder, apart from the states.
pub(super) struct Registrations {
    pub(super) declarations: Vec<Declared>,
    pub(super) scopes: Vec<(ScopeId, &'static str, Option<SourceLocation>)>,
    pub(super) handlers: Vec<HandlerEntry>,
    pub(super) policies: Vec<(Declared, Option<u32>)>,
    pub(super) discovered: bool,
}

/// The registry's categories, each with its one handler; or every problem found.
pub(super) fn validate(
    registrations: Registrations,
    state: &StateMap,
) -> Result<HashMap<CategoryId, CategoryInfo>, Vec<RegistryProblem>> {
    let Registrations {
        declarations,
        scopes,
        handlers,
        policies,
        discovered,
    } = registrations;
    let mut problems = Vec::new();
    missing_states(&handlers, state, &mut problems);
    let declarations = if discovered {
        declarations
    } else {
        declared_by_handlers(&handlers)
    };
    unique_scopes(scopes, &declarations, &mut problems);
    let (unique, taken_ids) = unique_categories(declarations, &mut problems);
    let mut categories = one_handler_each(unique, handlers, &mut problems, |stray| {
        // Without declarations, a handler whose category id is taken by another category was
        // reported as a duplicate id.
        discovered || !taken_ids.contains_key(&stray.identity.id)
    });
    apply_policies(policies, &mut categories, &mut problems);
    if problems.is_empty() {
        Ok(categories)
    } else {
        Err(problems)
    }
}

/// The dead-letter policies given to the builder, over the declarations', in order: each
/// for a category of the registry, and never of 0 attempts.
fn apply_policies(
    policies: Vec<(Declared, Option<u32>)>,
    categories: &mut HashMap<CategoryId, CategoryInfo>,
    problems: &mut Vec<RegistryProblem>,
) {
    for (category, max_attempts) in policies {
        if max_attempts == Some(0) {
            problems.push(RegistryProblem::ZeroMaxAttempts {
                category: category.site(),
            });
            continue;
        }
        match categories.get_mut(&category.identity.id) {
            Some(info)
                if (info.identity.name, info.identity.scope)
                    == (category.identity.name, category.identity.scope) =>
            {
                info.identity.max_attempts = max_attempts;
            }
            _ => problems.push(RegistryProblem::PolicyForUnknownCategory {
                category: category.site(),
            }),
        }
    }
}

/// Each [`State<T>`](crate::State) a handler takes that nobody gave.
fn missing_states(
    handlers: &[HandlerEntry],
    state: &StateMap,
    problems: &mut Vec<RegistryProblem>,
) {
    for entry in handlers {
        for (type_id, state_type) in entry.requirements.states() {
            if !state.contains(type_id) {
                problems.push(RegistryProblem::MissingState {
                    category: entry.category.site(),
                    handler: entry.category.at,
                    state_type,
                });
            }
        }
    }
}

/// Without declarations, each handler declares its category (never `no_op`: a `no_op`
/// registration is itself the handler).
fn declared_by_handlers(handlers: &[HandlerEntry]) -> Vec<Declared> {
    let mut declared: Vec<Declared> = Vec::new();
    for entry in handlers {
        match declared
            .iter_mut()
            .find(|d| d.same_category(&entry.category))
        {
            Some(seen) => {
                seen.model = seen.model.or(entry.category.model);
                seen.backfill = seen.backfill.or(entry.category.backfill);
            }
            None => declared.push(Declared {
                no_op: false,
                ..entry.category
            }),
        }
    }
    declared
}

/// Scopes: the declared ones, then those the categories name; one name per id.
fn unique_scopes(
    scopes: Vec<(ScopeId, &'static str, Option<SourceLocation>)>,
    declarations: &[Declared],
    problems: &mut Vec<RegistryProblem>,
) {
    let mut seen_scopes: HashMap<ScopeId, Site> = HashMap::new();
    let category_scopes = declarations.iter().map(|d| {
        (
            d.identity.scope,
            d.identity.scope_name,
            None::<SourceLocation>,
        )
    });
    for (id, name, at) in scopes.into_iter().chain(category_scopes) {
        let site = Site {
            name,
            id: i64::from(id.0),
            at,
        };
        match seen_scopes.entry(id) {
            Entry::Occupied(seen) if seen.get().name != name => {
                problems.push(RegistryProblem::DuplicateScopeId {
                    first: *seen.get(),
                    second: site,
                });
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(slot) => {
                slot.insert(site);
            }
        }
    }
}

/// Categories: unique ids and names. Returns the first category of each id, in order, and
/// the ids taken.
fn unique_categories(
    declarations: Vec<Declared>,
    problems: &mut Vec<RegistryProblem>,
) -> (Vec<Declared>, HashMap<CategoryId, Declared>) {
    let mut by_id: HashMap<CategoryId, Declared> = HashMap::new();
    let mut by_name: HashMap<&'static str, Declared> = HashMap::new();
    let mut unique = Vec::new();
    for declared in declarations {
        if let Some(seen) = by_name.get(declared.identity.name)
            && seen.identity.id != declared.identity.id
        {
            problems.push(RegistryProblem::DuplicateCategoryName {
                first: seen.site(),
                second: declared.site(),
            });
        }
        by_name.entry(declared.identity.name).or_insert(declared);
        match by_id.entry(declared.identity.id) {
            Entry::Occupied(seen) => problems.push(RegistryProblem::DuplicateCategoryId {
                first: seen.get().site(),
                second: declared.site(),
            }),
            Entry::Vacant(slot) => {
                slot.insert(declared);
                unique.push(declared);
            }
        }
    }
    (unique, by_id)
}

/// Handlers: exactly one per category (one of each role for a replicated model), none for a
/// category nobody declared (when `report_stray` says a leftover handler is worth reporting).
fn one_handler_each(
    unique: Vec<Declared>,
    handlers: Vec<HandlerEntry>,
    problems: &mut Vec<RegistryProblem>,
    report_stray: impl Fn(&Declared) -> bool,
) -> HashMap<CategoryId, CategoryInfo> {
    let mut handlers: Vec<Option<HandlerEntry>> = handlers.into_iter().map(Some).collect();
    let mut categories = HashMap::new();
    for declared in unique {
        let mine: Vec<HandlerEntry> = handlers
            .iter_mut()
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_some_and(|entry| entry.category.same_category(&declared))
            })
            .filter_map(Option::take)
            .collect();
        // The model's type is known where its handlers were registered.
        let backfill = declared
            .backfill
            .or_else(|| mine.iter().find_map(|entry| entry.category.backfill));
        let handler = if declared.model.is_some() {
            model_handler(&declared, mine, problems)
        } else {
            category_handler(&declared, mine, problems)
        };
        let Some((handler, no_op)) = handler else {
            continue;
        };
        categories.insert(
            declared.identity.id,
            CategoryInfo {
                identity: declared.identity,
                no_op,
                model: declared.model,
                backfill,
                handler,
            },
        );
    }
    for stray in handlers.into_iter().flatten() {
        if report_stray(&stray.category) {
            problems.push(RegistryProblem::UndeclaredCategory {
                category: stray.category.site(),
            });
        }
    }
    categories
}

/// The one handler of a plain category, and whether it is a no-op; or the problems.
fn category_handler(
    declared: &Declared,
    mine: Vec<HandlerEntry>,
    problems: &mut Vec<RegistryProblem>,
) -> Option<(Arc<dyn ErasedHandler>, bool)> {
    let mut mine = mine.into_iter();
    match (mine.next(), mine.next()) {
        (Some(first), Some(second)) => {
            problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: first.category.at,
                second: second.category.at,
            });
            None
        }
        (Some(handler), None) if declared.no_op => {
            problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: declared.at,
                second: handler.category.at,
            });
            None
        }
        (Some(handler), None) => Some((handler.handler, handler.category.no_op)),
        (None, _) if declared.no_op => Some((Arc::new(NoOpErased), true)),
        (None, _) => {
            problems.push(RegistryProblem::MissingHandler {
                category: declared.site(),
                type_name: declared.identity.type_name,
            });
            None
        }
    }
}

/// The replication and deletion handlers of a replicated model, joined; or the problems.
fn model_handler(
    declared: &Declared,
    mine: Vec<HandlerEntry>,
    problems: &mut Vec<RegistryProblem>,
) -> Option<(Arc<dyn ErasedHandler>, bool)> {
    let mut replication: Option<HandlerEntry> = None;
    let mut deletion: Option<HandlerEntry> = None;
    let before = problems.len();
    for entry in mine {
        let slot = match entry.role {
            Role::Delivery => {
                problems.push(RegistryProblem::DeliveryHandlerForModel {
                    category: declared.site(),
                    at: entry.category.at,
                });
                continue;
            }
            Role::Replication => &mut replication,
            Role::Deletion => &mut deletion,
        };
        match slot {
            Some(first) => problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: first.category.at,
                second: entry.category.at,
            }),
            None => *slot = Some(entry),
        }
    }
    for (entry, kind) in [(&replication, "Replication"), (&deletion, "Deletion")] {
        if entry.is_none() {
            problems.push(RegistryProblem::MissingModelHandler {
                category: declared.site(),
                kind,
                model_type: declared.identity.type_name,
            });
        }
    }
    match (replication, deletion) {
        (Some(replication), Some(deletion)) if problems.len() == before => {
            let dispatch = ModelDispatch {
                replication: replication.handler,
                deletion: deletion.handler,
            };
            Some((Arc::new(dispatch), false))
        }
        _ => None,
    }
}
