//! Attribute macros for **outbox**, re-exported by `outbox-core` (feature `macros`, on by
//! default): use them as `outbox_core::outbox_category` and so on.
//!
//! - `#[outbox_scope(id = 1)]` on a unit struct declares a scope.
//! - `#[outbox_category(scope = Organization, id = 2)]` on a payload type declares a category
//!   carrying that payload (`coalesce = false` for event-style categories, `no_op` for one that
//!   needs no handler, `name = "..."` to override the snake-case name, `max_attempts = 5` to set
//!   a failing group aside as dead letters after five attempts instead of blocking its shard).
//! - `#[outbox_categories(scope = Organization)]` on an enum declares a scope's categories
//!   together: each variant holds one category's payload (`#[category(id = 1)] Renamed(Renamed)`),
//!   and one handler taking `Delivery<TheEnum>` handles them all.
//! - `#[replicated_model(scope = Organization, id = 3, table = "projects", shard =
//!   organization_id)]` on a domain struct declares a model replicated through one category
//!   covering its creation, updates and deletion.
//! - `#[outbox_handler]` on `async fn f(delivery: Delivery<C>) -> Result<(), E>` registers the
//!   handler of category `C`; on `async fn f(r: Replication<M>)` or `async fn f(d:
//!   Deletion<M>)`, the replication or deletion handler of model `M`. Arguments after the
//!   delivery are made from each call (`State<T>`, `Connection<'_, T>`: any `FromContext`
//!   type), and the states they take are checked when the registry is built.
//! - `#[outbox_test]`, re-exported by `outbox-testkit` as `#[outbox_testkit::test]`, on
//!   `async fn t(db: PgTestDatabase)` (or `SqliteTestDatabase`) makes a `#[test]` running the
//!   function with a fresh database, dropped afterwards.
//!
//! Each declaration is registered with `inventory`; `Registry::discover()` collects them at
//! start-up and refuses what the compiler cannot see (duplicates across crates, categories
//! without handlers, handlers of undeclared categories). Within one crate, a scope or category
//! id, or a category name, used twice is a compile error.
//!
//! Each macro parses its arguments, validates them against the item, and expands, in a module
//! of its own; the functions work on `proc_macro2` tokens so that tests can call them.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod categories;
mod category;
mod common;
mod handler;
mod model;
mod paths;
mod scope;
mod test_attr;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Declares a scope: `#[outbox_scope(id = 1)]` on a unit struct.
///
/// Options: `id` (required: the stable small integer stored in every row of the scope),
/// `name` (defaults to the type's name in snake case).
#[proc_macro_attribute]
pub fn outbox_scope(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(common::expand(args.into(), &item.into(), &scope::MACRO)).into()
}

/// Declares a category on its payload type:
/// `#[outbox_category(scope = Organization, id = 2)]`.
///
/// Options: `scope` (required, exactly one), `id` (required: the stable integer stored in
/// every row), `name` (defaults to the type's name in snake case), `coalesce = false` (deliver
/// every message in order instead of the newest per object), `no_op` (needs no handler),
/// `max_attempts = n` (the dead-letter policy: after `n` failed attempts, from 1, a failing
/// group moves to the dead letters and its shard goes on; without it, the shard blocks on the
/// group, retrying it with backoff until it succeeds), `sink = NatsSink` (the category's
/// handler is the sink of that type given to `Registry::builder().state(..)`, publishing each
/// message to the sink's destination for the category: see `outbox_core::sink`).
#[proc_macro_attribute]
pub fn outbox_category(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(common::expand(args.into(), &item.into(), &category::MACRO)).into()
}

/// Declares a scope's categories together on an enum, each variant holding one category's
/// payload:
///
/// ```ignore
/// #[outbox_categories(scope = Organization)]
/// enum OrgEvent {
///     #[category(id = 1)]
///     Renamed(Renamed),
///     #[category(id = 2, name = "member_added", coalesce = false)]
///     MemberAdded(MemberAdded),
/// }
/// ```
///
/// Each payload type becomes a category of the scope, as if declared with
/// `#[outbox_category]` (`id` required; `name` defaults to the variant's name in snake case;
/// `coalesce = false` for event-style categories; `max_attempts = n` for its dead-letter
/// policy). A handler taking `Delivery<OrgEvent>` is
/// the handler of every one of them, and receives the variant of each message's category.
/// Ids and names are checked unique in the enum (a compile error naming both variants) and in
/// the crate.
#[proc_macro_attribute]
pub fn outbox_categories(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(categories::expand(args.into(), &item.into())).into()
}

/// Declares a replicated model on a struct with named fields:
/// `#[replicated_model(scope = Organization, id = 3, table = "projects", shard = organization_id)]`.
///
/// Options: `scope`, `id`, `name` and `max_attempts` as for `#[outbox_category]`; `table` (required: the
/// table holding the rows, whose columns are named like the fields); `shard` (required: the
/// integer field holding the shard identifier); `key` (the integer field holding the primary
/// key, `id` by default); `tombstone = T` (the payload saved with every write for the deletion
/// handler, built with `T: From<&Model>`; `()` by default); `fan_out` (each write names its
/// destinations).
#[proc_macro_attribute]
pub fn replicated_model(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(common::expand(args.into(), &item.into(), &model::MACRO)).into()
}

/// Registers an `async fn` as a handler: of the category its `Delivery<C>` argument names, or
/// of the replications or deletions of the model its `Replication<M>` or `Deletion<M>`
/// argument names. Its other arguments (`State<T>`, `Connection<'_, T>`, any `FromContext`
/// type) are made from each call's context.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(common::expand(args.into(), &item.into(), &handler::MACRO)).into()
}

/// Makes an `async fn` taking a test database a `#[test]` with a database of its own.
///
/// `#[outbox_testkit::test]` on `async fn t(db: PgTestDatabase)` (or `SqliteTestDatabase`, or
/// another `outbox_testkit::TestDatabase`) runs the function on a new tokio runtime with a new
/// database with the outbox migrations applied, and drops the database when the function
/// returns or panics. The function may return `Result<(), E>` with `E: Debug`; its other
/// attributes (`#[should_panic]`, `#[ignore]`...) apply to the generated `#[test]`.
///
/// Options: `flavor = "current_thread"` (the runtime; `"multi_thread"` by default),
/// `migrations = false` (an empty database).
///
/// Use it as `outbox_testkit::test`: the expansion names the test kit.
#[proc_macro_attribute]
pub fn outbox_test(args: TokenStream, item: TokenStream) -> TokenStream {
    paths::rebase(test_attr::expand(args.into(), &item.into())).into()
}
