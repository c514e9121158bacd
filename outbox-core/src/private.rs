//! What the macros' expansions name, through `::outbox_core::__private`, and what the test
//! kit steps a relay with. Not public API.

pub use crate::categories::not_in_enum;
pub use crate::error::SourceLocation;
pub use crate::registry::declare::{CategoryDeclaration, HandlerDeclaration, ScopeDeclaration};

/// What a category enum's payloads fail to read with.
pub type JsonError = serde_json::Error;
pub use inventory;

use crate::categories::Deliverable;
pub use crate::handler::HandlerOutput;
use crate::handler::{Deletion, Replication};
use crate::handler::{Delivery, Handler};
use crate::registry::RegistryBuilder;
use crate::replicated::ReplicatedModel;

/// What an `#[outbox_handler]` function's first argument is, and so what it handles: every
/// delivery of a category, or the replications or deletions of a model.
pub trait HandlerKind: Sized {
    /// Adds the handler to a registry builder.
    fn register<H: Handler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder;
}

impl<C: Deliverable> HandlerKind for Delivery<C> {
    fn register<H: Handler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.handle_declared::<C>(handler, at)
    }
}

impl<M: ReplicatedModel> HandlerKind for Replication<M> {
    fn register<H: Handler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.replication_declared::<M>(handler, at)
    }
}

impl<M: ReplicatedModel> HandlerKind for Deletion<M> {
    fn register<H: Handler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.deletion_declared::<M>(handler, at)
    }
}

/// The scope of a category whose declaration failed to compile (its error is reported).
pub struct Undeclared;

impl crate::model::Scope for Undeclared {
    const ID: crate::model::ScopeId = crate::model::ScopeId(0);
    const NAME: &'static str = "";
}

pub use crate::id::Identifier;

/// Sets the pace `relay` measured its handlers at to `turn` a turn, as if each turn so far had
/// lasted that long: how many shards it holds while they wait for a turn follows from it. The
/// test kit's tests of held shards pin it rather than measure it on a busy machine, where one
/// turn preempted for a few milliseconds leaves the relay holding fewer shards than the test
/// steps. Real turns go on updating it.
pub fn assume_turns_take<S: crate::store::Store>(
    relay: &crate::Relay<S>,
    turn: std::time::Duration,
) {
    relay.assume_turns_take(turn);
}
