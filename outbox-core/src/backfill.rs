//! Backfill: outboxes for the rows a replicated model already had when it started to
//! replicate, or when its replication changed.
//!
//! A model declares the version of its replication logic (`#[replicated_model(...,
//! replication_version = N)]`, 1 by default). An operator starts a backfill to a version
//! ([`Admin::start_backfill`](crate::admin::Admin::start_backfill), `outbox backfill start`): from
//! then on the relays whose code declares that version (or a later one) walk the model's
//! table in key order, a batch per tick, and write each row's outbox exactly as a `save` of
//! the row would (its tombstone as payload; a fan-out model's to the destinations the row
//! names, or to those of them the operator chose). Until an operator starts it, a new
//! version is inert.
//!
//! Progress is a row per model in the database (the watermark: the version walked, the last
//! key done, the version completed), written in the transaction that writes the batch's
//! outboxes: a batch is walked once, or not at all, whichever relay walks it, and a walk
//! resumes where it stopped after a restart or on another process. A relay walks a batch
//! while it holds the model's watermark row (as it drains a shard while it holds the shard's
//! state row); another relay skips the model meanwhile. Once a walk reaches the end of the
//! table, the watermark records the version as done: rows written afterwards get their
//! outboxes from their own writes. A later version walks the table again from its lowest key;
//! lowering the target ([`Admin::pause_backfill`](crate::admin::Admin::pause_backfill)) pauses the
//! walk where it is.
//!
//! Each tick writes at most [`backfill_budget`](crate::RelayConfigBuilder::backfill_budget)
//! rows, less the messages already pending in the outbox, and at least one: live traffic
//! goes first, and a batch is never empty by arithmetic (an empty batch would read as the end
//! of the table, and complete a walk that skipped rows).

use std::fmt;
use std::time::SystemTime;

use crate::columns::ModelRow;
use crate::error::Error;
use crate::id::Id;
use crate::model::{CategoryId, Destination, Message};
use crate::replicated::{ModelTable, ReplicatedModel};

/// A replicated model as a backfill walks it, its type erased: what a store needs to read its
/// rows and write their outboxes. Made by the registry for every replicated model it holds
/// ([`Registry::backfill_models`](crate::Registry::backfill_models)).
#[derive(Clone, Copy)]
pub struct BackfillModel {
    /// The model's category.
    pub category: CategoryId,
    /// The model's name (its category's).
    pub name: &'static str,
    /// Where its rows live.
    pub table: ModelTable,
    /// The replication version this binary's code declares.
    pub version: u32,
    /// Whether the model fans out to destinations.
    pub fan_out: bool,
    walk: fn(&ModelRow, Option<&[Destination]>) -> Result<WalkedRow, Error>,
}

impl fmt::Debug for BackfillModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackfillModel")
            .field("category", &self.category)
            .field("name", &self.name)
            .field("table", &self.table)
            .field("version", &self.version)
            .field("fan_out", &self.fan_out)
            .finish_non_exhaustive()
    }
}

/// One row of a model as a backfill walked it: its key and its outboxes.
#[derive(Debug, Clone, PartialEq)]
pub struct WalkedRow {
    /// The row's key: the walk's low bound once the row is done.
    pub key: Id,
    /// The outboxes a `save` of the row writes (none for a fan-out row whose destinations
    /// the operator's choice leaves out).
    pub messages: Vec<Message>,
}

impl BackfillModel {
    /// Model `M` as a backfill walks it.
    pub fn of<M: ReplicatedModel>() -> Self {
        Self {
            category: M::ID,
            name: M::NAME,
            table: M::TABLE,
            version: M::REPLICATION_VERSION,
            fan_out: M::FAN_OUT,
            walk: walk_row::<M>,
        }
    }

    /// The key and outboxes of one row, read back as the model; a fan-out row's outboxes go
    /// to the destinations it names, or to those of them among `only`.
    pub fn walk(&self, row: &ModelRow, only: Option<&[Destination]>) -> Result<WalkedRow, Error> {
        (self.walk)(row, only)
    }
}

fn walk_row<M: ReplicatedModel>(
    row: &ModelRow,
    only: Option<&[Destination]>,
) -> Result<WalkedRow, Error> {
    let model: M = row.deserialize().map_err(|error| Error::BackfillRow {
        model: M::NAME,
        key: None,
        detail: format!("the row does not read back as the model: {error}"),
    })?;
    let key = model.object_identifier();
    let destinations = match (M::FAN_OUT, only) {
        (false, None) => None,
        (false, Some(_)) => {
            return Err(Error::BackfillRow {
                model: M::NAME,
                key: Some(key),
                detail: "the backfill names destinations, but the model is local: start it \
                         again without destinations"
                    .to_owned(),
            });
        }
        (true, only) => {
            let named = model
                .backfill_destinations()
                .ok_or_else(|| Error::BackfillRow {
                    model: M::NAME,
                    key: Some(key),
                    detail: "a fan-out model's backfill needs the destinations of each row: \
                         declare them with `#[replicated_model(..., fan_out, destinations = \
                         <function>)]`"
                        .to_owned(),
                })?;
            Some(match only {
                Some(only) => named.into_iter().filter(|d| only.contains(d)).collect(),
                None => named,
            })
        }
    };
    let messages =
        crate::replicated::messages_of(std::slice::from_ref(&model), destinations.as_deref())?;
    Ok(WalkedRow { key, messages })
}

/// What a tick of one model's backfill is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillOptions {
    /// Who walks; recorded on the watermark for operators.
    pub worker: String,
    /// The most rows a batch walks, before the backlog is taken off.
    pub budget: usize,
}

/// How many rows a batch walks: the budget less the messages pending in the outbox, and at
/// least one. Never zero: a batch that asked for no row would find none, and a walk reads
/// "no row found" as the end of the table.
pub fn batch_size(budget: usize, backlog: usize) -> usize {
    budget.saturating_sub(backlog).max(1)
}

/// A model's backfill as the database records it: the operator's target, the walk's
/// progress, what is done.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackfillState {
    /// The model's category.
    pub category: CategoryId,
    /// The model's name, as the relays (or the operator who started it) recorded it.
    pub model: String,
    /// The highest replication version a relay's code declared for the model.
    pub declared_version: u32,
    /// The version an operator started (0: never started): the gate.
    pub target_version: u32,
    /// The version of the walk under way, or of the last one (0: none yet).
    pub walking_version: u32,
    /// The highest version whose walk completed (0: none).
    pub done_version: u32,
    /// The key of the last row walked at `walking_version`: the walk goes on above it
    /// (`None`: from the lowest key).
    pub low_bound: Option<Id>,
    /// Rows walked at `walking_version`.
    pub rows_walked: u64,
    /// The destinations the operator restricted a fan-out model's backfill to, if any.
    pub destinations: Option<Vec<Destination>>,
    /// The relay that walked the last batch.
    pub worker: Option<String>,
    /// When the walk at `walking_version` started.
    pub started_at: Option<SystemTime>,
    /// When a batch was last walked (or the state last changed).
    pub updated_at: Option<SystemTime>,
    /// When the last walk completed.
    pub completed_at: Option<SystemTime>,
    /// The last batch's error, until a batch succeeds.
    pub last_error: Option<String>,
}

/// Where a model's backfill stands (see [`BackfillState::phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackfillPhase {
    /// Never started.
    NotStarted,
    /// Started: relays walk it (or will, at their next tick).
    Walking,
    /// Started to a version that no relay's code declares yet: it waits for their deploy.
    WaitingForCode,
    /// Stopped where it was by an operator: started again, it goes on from there.
    Paused,
    /// The target version's walk completed.
    Done,
}

impl fmt::Display for BackfillPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotStarted => "not started",
            Self::Walking => "walking",
            Self::WaitingForCode => "waiting for code",
            Self::Paused => "paused",
            Self::Done => "done",
        })
    }
}

impl BackfillState {
    /// The state of a model whose backfill was never started (what a relay records the first
    /// time it sees the model).
    pub fn new(category: CategoryId, model: impl Into<String>) -> Self {
        Self {
            category,
            model: model.into(),
            declared_version: 0,
            target_version: 0,
            walking_version: 0,
            done_version: 0,
            low_bound: None,
            rows_walked: 0,
            destinations: None,
            worker: None,
            started_at: None,
            updated_at: None,
            completed_at: None,
            last_error: None,
        }
    }

    /// Where the backfill stands.
    pub fn phase(&self) -> BackfillPhase {
        if self.target_version > self.done_version {
            if self.declared_version < self.target_version {
                BackfillPhase::WaitingForCode
            } else {
                BackfillPhase::Walking
            }
        } else if self.walking_version > self.done_version {
            BackfillPhase::Paused
        } else if self.done_version > 0 {
            BackfillPhase::Done
        } else {
            BackfillPhase::NotStarted
        }
    }

    /// The walk's rate, in rows a second: the rows walked at `walking_version` over the time
    /// from its first batch to its last (pauses included); `None` before its second batch.
    pub fn rows_per_second(&self) -> Option<f64> {
        let (Some(started), Some(last)) = (self.started_at, self.updated_at) else {
            return None;
        };
        let took = last.duration_since(started).ok()?.as_secs_f64();
        (self.rows_walked > 0 && took > 0.0).then(|| self.rows_walked as f64 / took)
    }

    /// What a relay whose code declares `code_version` does next: walk, or nothing.
    pub fn next_step(&self, code_version: u32) -> BackfillStep {
        let target = self.target_version;
        if target <= self.done_version || code_version < target {
            BackfillStep::Gated
        } else if self.walking_version == target {
            BackfillStep::Walk {
                version: target,
                after: self.low_bound,
            }
        } else {
            BackfillStep::Walk {
                version: target,
                after: None,
            }
        }
    }

    /// This state after a batch that walked `rows` rows up to `last` (their highest key) at
    /// `version`, of a batch of `size`: a batch that found fewer rows than it asked for
    /// reached the end of the table and completes the walk.
    pub fn after_batch(
        &self,
        version: u32,
        rows: usize,
        size: usize,
        last: Option<Id>,
        worker: &str,
        now: SystemTime,
    ) -> Self {
        let restarted = self.walking_version != version;
        let walked = if restarted { 0 } else { self.rows_walked };
        let complete = rows < size;
        Self {
            walking_version: version,
            done_version: if complete { version } else { self.done_version },
            low_bound: if complete {
                None
            } else {
                last.or(if restarted { None } else { self.low_bound })
            },
            rows_walked: walked + rows as u64,
            worker: Some(worker.to_owned()),
            started_at: if restarted {
                Some(now)
            } else {
                self.started_at
            },
            updated_at: Some(now),
            completed_at: if complete {
                Some(now)
            } else {
                self.completed_at
            },
            last_error: None,
            ..self.clone()
        }
    }
}

/// What a relay does next for a model's backfill ([`BackfillState::next_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillStep {
    /// Nothing: not started, done, paused, or started to a version this binary's code does
    /// not declare.
    Gated,
    /// Walk the batch above `after` (from the lowest key if `None`) for `version`.
    Walk {
        /// The version walked.
        version: u32,
        /// The low bound.
        after: Option<Id>,
    },
}

/// What one tick of one model's backfill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillOutcome {
    /// Another relay holds the model's watermark: it is walking a batch.
    Busy,
    /// Nothing to walk (see [`BackfillStep::Gated`]).
    Gated,
    /// A batch was walked and its outboxes written.
    Walked {
        /// The version walked.
        version: u32,
        /// The batch size asked for: the budget less the backlog, at least one.
        size: usize,
        /// Rows walked.
        rows: usize,
        /// Outboxes written.
        messages: usize,
        /// Whether the batch reached the end of the table and completed the walk.
        complete: bool,
    },
}

/// What one tick of one model's backfill did, and the model's state after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillBatch {
    /// The model's name.
    pub model: &'static str,
    /// What the tick did.
    pub outcome: BackfillOutcome,
    /// The model's state after the tick (`None` when another relay held it).
    pub state: Option<BackfillState>,
}

impl BackfillBatch {
    /// The rows the tick walked (0 unless it [`Walked`](BackfillOutcome::Walked)).
    pub fn rows(&self) -> usize {
        match self.outcome {
            BackfillOutcome::Walked { rows, .. } => rows,
            BackfillOutcome::Busy | BackfillOutcome::Gated => 0,
        }
    }
}

/// What an operator asks of [`Admin::start_backfill`](crate::admin::Admin::start_backfill).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackfillStart {
    /// The model's category.
    pub category: CategoryId,
    /// The model's name, if the caller knows it (recorded for operators until a relay
    /// records it).
    pub model: Option<String>,
    /// The version to walk to. A version above the one walked so far walks the whole table
    /// again; the version being walked resumes it.
    pub version: u32,
    /// For a fan-out model: only these destinations (`None`: every destination each row
    /// names).
    pub destinations: Option<Vec<Destination>>,
}

impl BackfillStart {
    /// A start of `category`'s backfill to `version`.
    pub fn new(category: CategoryId, version: u32) -> Self {
        Self {
            category,
            model: None,
            version,
            destinations: None,
        }
    }

    /// With the model's name.
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.model = Some(name.into());
        self
    }

    /// Restricted to `destinations` (a fan-out model's).
    pub fn destinations(mut self, destinations: impl IntoIterator<Item = Destination>) -> Self {
        self.destinations = Some(destinations.into_iter().collect());
        self
    }

    /// Refuses version 0 (no version to walk to).
    pub fn check(&self) -> Result<(), Error> {
        if self.version == 0 {
            return Err(Error::InvalidConfig {
                setting: "version",
                problem: "must be 1 or more: replication versions start at 1".to_owned(),
            });
        }
        Ok(())
    }
}

/// The destinations of a backfill as the backends store them: a JSON array of names.
pub fn destinations_json(destinations: Option<&[Destination]>) -> Option<String> {
    destinations.map(|destinations| {
        serde_json::Value::Array(
            destinations
                .iter()
                .map(|d| serde_json::Value::String(d.as_str().to_owned()))
                .collect(),
        )
        .to_string()
    })
}

/// The destinations of a backfill read back from [`destinations_json`]'s form.
pub fn destinations_from_json(json: Option<&str>) -> Result<Option<Vec<Destination>>, Error> {
    let Some(json) = json else {
        return Ok(None);
    };
    let names: Vec<String> = serde_json::from_str(json).map_err(|error| Error::Undecodable {
        operation: "reading a backfill's destinations",
        message_id: None,
        detail: error.to_string(),
    })?;
    names
        .into_iter()
        .map(Destination::new)
        .collect::<Result<_, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_never_empty() {
        assert_eq!(batch_size(100, 0), 100);
        assert_eq!(batch_size(100, 30), 70);
        assert_eq!(batch_size(100, 100), 1);
        assert_eq!(batch_size(100, 5_000), 1);
        assert_eq!(batch_size(0, 0), 1);
    }

    fn state(target: u32, walking: u32, done: u32, declared: u32) -> BackfillState {
        BackfillState {
            target_version: target,
            walking_version: walking,
            done_version: done,
            declared_version: declared,
            low_bound: (walking > 0).then(|| Id::integer(10)),
            ..BackfillState::new(CategoryId(1), "m")
        }
    }

    #[test]
    fn steps_follow_the_gate() {
        // Never started: inert whatever the code says.
        assert_eq!(state(0, 0, 0, 2).next_step(2), BackfillStep::Gated);
        // Started to 2: a binary declaring 1 waits; one declaring 2 or 3 walks 2.
        let started = state(2, 0, 0, 2);
        assert_eq!(started.next_step(1), BackfillStep::Gated);
        let fresh = BackfillStep::Walk {
            version: 2,
            after: None,
        };
        assert_eq!(started.next_step(2), fresh);
        assert_eq!(started.next_step(3), fresh);
        // Resumed where it stopped.
        assert_eq!(
            state(2, 2, 0, 2).next_step(2),
            BackfillStep::Walk {
                version: 2,
                after: Some(Id::integer(10))
            }
        );
        // A higher version walks again from the lowest key.
        assert_eq!(
            state(3, 2, 2, 3).next_step(3),
            BackfillStep::Walk {
                version: 3,
                after: None
            }
        );
        // Done, or paused (target lowered to what is done).
        assert_eq!(state(2, 2, 2, 2).next_step(2), BackfillStep::Gated);
        assert_eq!(state(1, 2, 1, 2).next_step(2), BackfillStep::Gated);
    }

    #[test]
    fn phases() {
        assert_eq!(state(0, 0, 0, 1).phase(), BackfillPhase::NotStarted);
        assert_eq!(state(2, 0, 0, 2).phase(), BackfillPhase::Walking);
        assert_eq!(state(2, 0, 0, 1).phase(), BackfillPhase::WaitingForCode);
        assert_eq!(state(1, 2, 1, 2).phase(), BackfillPhase::Paused);
        assert_eq!(state(2, 2, 2, 2).phase(), BackfillPhase::Done);
    }

    #[test]
    fn a_short_batch_completes_the_walk() {
        let now = SystemTime::UNIX_EPOCH;
        let walking = state(2, 2, 1, 2);
        let next = walking.after_batch(2, 5, 5, Some(Id::integer(20)), "w", now);
        assert_eq!(next.low_bound, Some(Id::integer(20)));
        assert_eq!(next.done_version, 1);
        let done = next.after_batch(2, 3, 5, Some(Id::integer(23)), "w", now);
        assert_eq!((done.done_version, done.low_bound), (2, None));
        assert_eq!(done.phase(), BackfillPhase::Done);
        // A restart counts its rows from zero.
        let restarted = state(3, 2, 2, 3).after_batch(3, 4, 5, None, "w", now);
        assert_eq!((restarted.rows_walked, restarted.done_version), (4, 3));
    }

    #[test]
    fn a_walk_reports_its_rate_from_its_first_batch_to_its_last() {
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let first = state(2, 1, 1, 2).after_batch(2, 100, 100, Some(Id::integer(100)), "w", start);
        assert_eq!(
            first.rows_per_second(),
            None,
            "one batch: no time to measure"
        );
        let later = start + std::time::Duration::from_secs(4);
        let second = first.after_batch(2, 100, 100, Some(Id::integer(200)), "w", later);
        assert_eq!(second.rows_per_second(), Some(50.0));
        assert_eq!(
            BackfillState::new(CategoryId(1), "m").rows_per_second(),
            None
        );
    }
}
