//! A crate that, unknowingly, takes ids `linking-categories` uses: scope id 1 for another
//! scope, category id 1 for another category. Each crate compiles on its own; a binary linking
//! both is refused at start-up, with both places named.

use outbox_core::{outbox_category, outbox_scope};
use serde::{Deserialize, Serialize};

/// Another scope, with the id of `linking_categories::Organization`.
#[outbox_scope(id = 1)]
#[derive(Debug)]
pub struct Team;

/// Another category, with the id of `linking_categories::ProjectRenamed`.
#[outbox_category(scope = Team, id = 1, no_op)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamRenamed {
    /// The team's new name.
    pub name: String,
}
