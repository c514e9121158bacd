//! The relay: finds due shards, claims them, delivers their messages, records the outcome.
//!
//! Its words, used the same way in names and docs:
//!
//! - to **drain** a shard is to claim it, deliver its groups in order until it is empty (up
//!   to a bound, for a flush), a delivery fails, its budget is spent or the relay stops, and
//!   release it recording how that ended;
//! - a **pass** walks discovery over every shard once, drains each due shard once, and waits
//!   for those drains: [`Relay::drain`] runs passes until one claims nothing,
//!   [`Relay::flush_due`] runs one bounded pass;
//! - a **sweep** is the background relay's walk of discovery over every shard: it starts the
//!   due shards' drains in its pool without waiting for them, and when a whole sweep found
//!   nothing due, [`Relay::run`] waits for a commit, a wake or the poll interval.
//!
//! The relay's pool bounds how many shards drain at once, in a pass, a flush or a run (a
//! claim's batch); their handlers take turns, `max_concurrent_shards` at once.
//!
//! Here too are what its runs report ([`DrainReport`], [`RunReport`], [`MaintenanceReport`],
//! [`FlushError`]), its health ([`Health`]) and how its delivery spans relate to the
//! writer's trace ([`TraceRelation`]).

// This file only assembles the relay: the handle services call (`api`), the state its passes,
// flushes and runs share (`inner`), and each step in a file of its own (claiming and draining
// a shard, planning its groups, delivering them, the background loop, the pool, the batches).

mod api;
mod config;
mod deliver;
mod flush;
mod health;
mod inner;
mod parked;
mod plan;
mod pool;
mod report;
mod run;
mod shard;
mod slots;
mod together;
mod walk;

pub use self::api::Relay;
pub use self::config::{Backoff, RelayConfig, RelayConfigBuilder};
pub use self::flush::{FlushError, Undelivered};
pub use self::health::Health;
pub use self::parked::WaitingShard;
pub use self::report::{DrainReport, MaintenanceReport, RunReport};
pub use self::shard::{DeadLettered, ShardFailure};
pub use crate::trace::TraceRelation;

use self::inner::Inner;
use self::shard::ShardRun;
use crate::error::Error;

/// How a shard's drain task ended: its run if the shard was claimed (`None` if it was not
/// due, or held by another worker), or the error that interrupted it.
type Drained = Result<Option<ShardRun>, Error>;
