//! # outbox-rs-sqlx
//!
//! The body that **outbox**'s `sqlx` backends share, written once over a [`Dialect`]:
//! transactions that remember what they wrote ([`OutboxTransaction`]), message and
//! replicated-model writes, migrations, the claimed shard's session and the store. A backend
//! (`outbox-postgres`, `outbox-sqlite`) supplies what truly differs: its SQL text
//! ([`Statements`]), its claim strategy, its wake-ups and how its errors read.
//!
//! Applications use the backends' crates, which name these types for their database
//! (`outbox_postgres::PgStore` is `SqlxStore<PgDialect>`); this crate is for writing a
//! backend. [`sql::Sql`] is everything it asks of a `sqlx` driver.
//!
//! ## Upgrades
//!
//! A backend's migrations ([`Dialect::MIGRATIONS`]) must be additive: a new one adds tables,
//! columns, indexes or constraints and never renames or drops what an older binary's
//! statements use, so that a binary runs against its own schema or any newer one (a rolling
//! deploy runs both). [`migrator()`] accepts a database with versions it does not know;
//! [`migrate()`] and the store's schema check say so in one `warn` line each; a schema missing
//! one of the binary's own migrations is [`Error::MigrationMissing`](outbox_core::Error::MigrationMissing)
//! until migrated (see [`migrate`](mod@migrate)).
//!
//! ## Writing a third backend
//!
//! A dialect type implementing [`Dialect`] (usually a unit struct): the [`Statements`] in the
//! database's SQL, with the parameters each documents; how lists travel
//! ([`Dialect::bind_ids`] and its siblings: an array, or one JSON parameter); the model
//! statements; [`Dialect::claim`] (at most one holder per shard, increasing fencing tokens);
//! and [`Dialect::classify`]. The conformance suite in `outbox-testkit` then proves it.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backfill;
pub mod connect;
pub mod dialect;
pub mod error;
pub mod inbox;
pub mod migrate;
pub mod model;
pub mod model_sql;
pub mod session;
pub mod space;
pub mod sql;
pub mod store;
pub mod stored;
pub mod transaction;
pub mod wake;
pub mod write;

pub use crate::dialect::{
    Ack, BackfillStatements, Claim, Claiming, Dialect, Fault, InboxStatements, RelayStatements,
    SetAsideStatements, Statements,
};
pub use crate::migrate::{migrate, migrator};
pub use crate::model::{Columns, Writable, Write};
pub use crate::session::SqlxSession;
pub use crate::store::{EXACT_GAUGES_UP_TO, SqlxStore};
pub use crate::transaction::{OutboxTransaction, begin};
pub use crate::wake::SqlxWakeups;
pub use crate::write::{write, write_all};

/// What [`backend_functions!`] expands to uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use outbox_core;
    pub use sqlx;
}

/// Defines a backend crate's public functions over its dialect, with their documentation:
/// `write` and `write_all` (messages), `insert`, `update`, `save` and `delete` (replicated
/// models), `migrator`, `migrator_up_to` and `migrate`. Invoked once by each backend, at its crate root:
/// `outbox_sqlx::backend_functions!(PgDialect, sqlx::Postgres, sqlx::PgConnection);`. It also
/// implements [`InboxTarget`](outbox_core::inbox::InboxTarget) for the backend's connection
/// and transaction.
#[macro_export]
macro_rules! backend_functions {
    (@model $dialect:ty, $database:ty, $name:ident, $write:ident, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Runs where `target` says, as [`write`] does: `&mut tx` joins the caller's
        /// transaction; a `&mut` connection or a `&pool` runs it in a transaction of its own,
        /// committed before it returns (the rows and their outboxes together, or neither).
        /// The model is compared with its table before its first write in the process
        /// ([`check_model`]).
        pub fn $name<'f, 'c: 'f, 't: 'c, 'a: 'f, M: $crate::model::Writable<$dialect>>(
            target: impl $crate::model::ModelTarget<'c, 't, $dialect> + 'f,
            models: impl $crate::__private::outbox_core::IntoModelBatch<'a, M>,
        ) -> $crate::__private::outbox_core::handler::BoxFuture<
            'f,
            ::std::result::Result<u64, $crate::__private::outbox_core::Error>,
        > {
            $crate::model::boxed::<$dialect, M>(target, $crate::Write::$write, models)
        }
    };
    // The inbox on `$target`, whose executor is `$($executor)* self`.
    (@inbox $dialect:ty, [$($generics:tt)*] $target:ty, [$($executor:tt)*]) => {
        impl<$($generics)*> $crate::__private::outbox_core::inbox::InboxTarget<$dialect> for $target {
            fn record<'a>(
                self,
                consumer: &'a str,
                message: $crate::__private::outbox_core::MessageId,
            ) -> $crate::__private::outbox_core::handler::BoxFuture<
                'a,
                ::std::result::Result<bool, $crate::__private::outbox_core::Error>,
            >
            where
                Self: 'a,
            {
                ::std::boxed::Box::pin($crate::inbox::record::<$dialect, _>(
                    $($executor)* self,
                    consumer,
                    message,
                ))
            }

            fn purge<'a>(
                self,
                consumer: &'a str,
                age: ::std::time::Duration,
            ) -> $crate::__private::outbox_core::handler::BoxFuture<
                'a,
                ::std::result::Result<u64, $crate::__private::outbox_core::Error>,
            >
            where
                Self: 'a,
            {
                ::std::boxed::Box::pin($crate::inbox::purge::<$dialect, _>(
                    $($executor)* self,
                    consumer,
                    age,
                ))
            }
        }
    };
    ($dialect:ty, $database:ty, $connection:ty) => {
        /// Writes one message with the caller's executor: a transaction (`&mut *tx`), a
        /// connection, or a pool. It commits or rolls back with the caller's transaction.
        pub async fn write<'e, E>(
            executor: E,
            message: &$crate::__private::outbox_core::Message,
        ) -> ::std::result::Result<
            $crate::__private::outbox_core::MessageId,
            $crate::__private::outbox_core::Error,
        >
        where
            E: $crate::__private::sqlx::Executor<'e, Database = $database>,
        {
            $crate::write::<$dialect, E>(executor, message).await
        }

        /// Writes many messages in one statement, with the caller's executor. Returns
        /// their ids in ascending order.
        pub async fn write_all<'e, E>(
            executor: E,
            messages: &[$crate::__private::outbox_core::Message],
        ) -> ::std::result::Result<
            ::std::vec::Vec<$crate::__private::outbox_core::MessageId>,
            $crate::__private::outbox_core::Error,
        >
        where
            E: $crate::__private::sqlx::Executor<'e, Database = $database>,
        {
            $crate::write_all::<$dialect, E>(executor, messages).await
        }

        $crate::backend_functions!(@inbox $dialect, ['c] &'c mut $connection, []);
        $crate::backend_functions!(@inbox $dialect,
            ['c, 't] &'c mut $crate::__private::sqlx::Transaction<'t, $database>, [&mut **]);

        $crate::backend_functions!(@model $dialect, $database, insert, Insert,
            "Inserts new models and writes their outboxes: two statements however many models \
             there are (up to the database's parameter limit). Returns the rows inserted. Fails, \
             writing nothing, if a key exists already, or appears twice in the call \
             ([`Error::DuplicateKey`](outbox_core::Error::DuplicateKey)).");
        $crate::backend_functions!(@model $dialect, $database, update, Update,
            "Updates existing models (matched by key) and writes their outboxes: two \
             statements however many models there are (up to the database's parameter limit). Returns the \
             rows updated; a model without a row still gets its outbox, delivered as a \
             deletion. A key may appear only once in one call \
             ([`Error::DuplicateKey`](outbox_core::Error::DuplicateKey)).");
        $crate::backend_functions!(@model $dialect, $database, save, Save,
            "Inserts or updates models (by key) and writes their outboxes: two statements \
             however many models there are (up to the database's parameter limit). Returns the rows \
             written. A key may appear only once in one call \
             ([`Error::DuplicateKey`](outbox_core::Error::DuplicateKey)): write the newer \
             state in a call of its own.");
        $crate::backend_functions!(@model $dialect, $database, delete, Delete,
            "Deletes the models' rows, then writes their outboxes: two statements however many \
             models there are. Each outbox carries \
             the model's tombstone, for the deletion handler. Returns the rows deleted. A key \
             may appear only once in one call \
             ([`Error::DuplicateKey`](outbox_core::Error::DuplicateKey)).");

        /// Compares replicated model `M` with its table: every field has its column, of a
        /// type that holds the field's values as they are. Fails with
        /// [`Error::ModelMismatch`](outbox_core::Error::ModelMismatch) naming the model, the
        /// field, the column and both types. The model writes run this check before a model's
        /// first write in the process; call it at start-up to fail before anything else.
        pub async fn check_model<M: $crate::model::Writable<$dialect>>(
            pool: &$crate::__private::sqlx::Pool<$database>,
        ) -> ::std::result::Result<(), $crate::__private::outbox_core::Error> {
            $crate::model::check_pooled::<$dialect, M>(pool).await
        }

        /// The migrator for the outbox tables, recorded in `_outbox_migrations`, for a
        /// migration tool of your own. It accepts a database that a newer binary migrated
        /// further (outbox migrations are additive).
        pub fn migrator() -> $crate::__private::sqlx::migrate::Migrator {
            $crate::migrator::<$dialect>()
        }

        /// The migrator of the outbox migrations up to `version`, inclusive: what a binary
        /// that embeds only those applies. To stage an upgrade, or to test one.
        pub fn migrator_up_to(version: i64) -> $crate::__private::sqlx::migrate::Migrator {
            $crate::migrate::migrator_up_to::<$dialect>(version)
        }

        /// Applies the outbox migrations that `pool`'s database lacks. Idempotent, and safe
        /// to run from several processes at once. On a database a newer binary migrated
        /// further it applies nothing, succeeds, and logs one `warn` line naming both sets of
        /// versions: this binary runs on the newer schema (outbox migrations are additive).
        pub async fn migrate(
            pool: &$crate::__private::sqlx::Pool<$database>,
        ) -> ::std::result::Result<(), $crate::__private::outbox_core::Error> {
            $crate::migrate::<$dialect>(pool).await
        }
    };
}
