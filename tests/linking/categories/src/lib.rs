//! The model crate of the linking test: one scope and one category, declared with the macros.
//! Its handler lives in `linking-handlers`, which this crate does not know.

use outbox_core::{outbox_category, outbox_scope};
use serde::{Deserialize, Serialize};

/// Shards the messages: one organization's messages are delivered in order.
#[outbox_scope(id = 1)]
#[derive(Debug)]
pub struct Organization;

/// A project was renamed. Its only handler is in `linking-handlers`.
#[outbox_category(scope = Organization, id = 1)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectRenamed {
    /// The project's new name.
    pub name: String,
}
