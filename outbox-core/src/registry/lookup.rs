//! The built registry: every category by id, with its handler, and the handlers' states.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::builder::RegistryBuilder;
use crate::backfill::BackfillModel;
use crate::error::Error;
use crate::handler::{ErasedHandler, StateMap};
use crate::model::{CategoryId, CategoryIdentity, Message, RawMessage};
use crate::replicated::ModelTable;

/// What the registry knows of one category.
#[derive(Clone)]
#[non_exhaustive]
pub struct CategoryInfo {
    /// The category's identity: id, name, scope, coalescing, and its dead-letter policy
    /// (`None` blocks the shard on a failing group, backing it off until it gets through;
    /// `Some(n)` sets the group aside after `n` failed attempts), as the registry applies it.
    pub identity: CategoryIdentity,
    /// Whether the handler was declared as a no-op.
    pub no_op: bool,
    /// For a replicated model: its table, where the relay looks each object up.
    pub model: Option<ModelTable>,
    /// For a replicated model: how a backfill walks it.
    pub backfill: Option<BackfillModel>,
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl fmt::Debug for CategoryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CategoryInfo")
            .field("identity", &self.identity)
            .field("no_op", &self.no_op)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// Every category this binary can deliver, keyed by id. Cheap to clone.
///
/// Built once at start-up, from the declarations the macros registered
/// ([`RegistryBuilder::discovered`]) or from handlers given by hand
/// ([`RegistryBuilder::handle`]), with the states the handlers take. A registry refuses to
/// build what it could not deliver, and names every problem at once: a category without a
/// handler, an id used twice across crates, a state a handler takes that was not given.
///
/// ```
/// use outbox_core::{BoxError, Category, Delivery, Error, Registry, State};
/// use outbox_core::{outbox_category, outbox_handler, outbox_scope};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_scope(id = 1)]
/// struct Team;
///
/// #[outbox_category(scope = Team, id = 1)]
/// #[derive(Serialize, Deserialize)]
/// struct TeamRenamed {
///     name: String,
/// }
///
/// /// What the handler needs, given to the registry once.
/// #[derive(Clone)]
/// struct Directory;
///
/// #[outbox_handler]
/// async fn rename(
///     delivery: Delivery<TeamRenamed>,
///     State(_directory): State<Directory>,
/// ) -> Result<(), BoxError> {
///     let _new_name = delivery.payload.name;
///     Ok(())
/// }
///
/// let registry = Registry::builder().discovered().state(Directory).build()?;
/// let info = registry.category(TeamRenamed::ID).expect("declared");
/// assert_eq!(info.identity.name, "team_renamed");
///
/// // Without the state its handler takes, the registry refuses to build.
/// let refused = Registry::builder().discovered().build().unwrap_err();
/// assert!(refused.to_string().contains("Directory"), "{refused}");
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    categories: Arc<HashMap<CategoryId, CategoryInfo>>,
    state: Arc<StateMap>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("categories", &self.categories())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The registry of everything declared with the macros in this binary:
    /// `Registry::builder().discovered().build()`.
    pub fn discover() -> Result<Self, Error> {
        Self::builder().discovered().build()
    }

    /// What the registry knows of a category.
    pub fn category(&self, id: CategoryId) -> Option<&CategoryInfo> {
        self.categories.get(&id)
    }

    /// All known categories, in id order.
    pub fn categories(&self) -> Vec<&CategoryInfo> {
        let mut all: Vec<_> = self.categories.values().collect();
        all.sort_by_key(|info| info.identity.id);
        all
    }

    /// The replicated models whose backfills this binary walks, in category order.
    pub fn backfill_models(&self) -> Vec<BackfillModel> {
        self.categories()
            .into_iter()
            .filter_map(|info| info.backfill)
            .collect()
    }

    /// The ids of all known categories.
    pub fn category_ids(&self) -> Vec<CategoryId> {
        self.categories()
            .into_iter()
            .map(|info| info.identity.id)
            .collect()
    }

    /// The ids of the categories whose groups coalesce: those whose older rows a paused
    /// shard may shed.
    pub(crate) fn coalescing_category_ids(&self) -> Vec<CategoryId> {
        self.categories()
            .into_iter()
            .filter(|info| info.identity.coalesce)
            .map(|info| info.identity.id)
            .collect()
    }

    /// A registry of `categories` whose handlers take their states from `state`.
    pub(super) fn new(categories: HashMap<CategoryId, CategoryInfo>, state: StateMap) -> Self {
        Self {
            categories: Arc::new(categories),
            state: Arc::new(state),
        }
    }

    pub(crate) fn state(&self) -> &StateMap {
        &self.state
    }
}

impl Message {
    /// Checks an untyped message against the registry: the category must be known and the
    /// scope must be the category's own. Nothing reaches the database otherwise.
    pub fn from_raw(raw: RawMessage, registry: &Registry) -> Result<Self, Error> {
        let info = registry
            .category(raw.category)
            .ok_or(Error::UnknownCategory {
                category: raw.category,
            })?;
        if info.identity.scope != raw.scope {
            return Err(Error::ScopeMismatch {
                category: info.identity.name,
                expected: info.identity.scope,
                expected_name: info.identity.scope_name,
                found: raw.scope,
            });
        }
        let payload = serde_json::to_string(&raw.payload).map_err(|source| Error::Serialize {
            category: info.identity.name,
            source,
        })?;
        Ok(Self::from_checked(
            raw,
            info.identity.name,
            info.identity.scope_name,
            payload,
        ))
    }
}
