//! What the outbox reports through the [`metrics`] facade: the names below, each with its
//! labels and unit. Install any `metrics` recorder (a Prometheus exporter, StatsD, ...) and
//! the writers and relays of the process report to it; without one, each report costs a
//! relaxed atomic load.
//!
//! Labels are bounded: a category's and a scope's declared names, an error's
//! [kind](crate::DeliveryError::kind), a shard's state. Shard and object identifiers never
//! appear in a label (they are in the spans).
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `outbox_messages_written_total` | counter | `category`, `scope` | messages inserted by `write`, `write_all` and model writes (counted at the insert; a rollback after it does not take it back) |
//! | `outbox_deliveries_total` | counter | `category`, `scope` | handler calls that succeeded |
//! | `outbox_handler_failures_total` | counter | `category`, `scope`, `kind` | deliveries that failed, by [`DeliveryError::kind`](crate::DeliveryError::kind) |
//! | `outbox_rows_acknowledged_total` | counter | `scope` | rows deleted after their delivery |
//! | `outbox_rows_coalesced_total` | counter | `category`, `scope` | rows a delivery covered without delivering them (a group's older rows) |
//! | `outbox_dead_lettered_total` | counter | `category`, `scope` | rows set aside as dead letters |
//! | `outbox_lease_losses_total` | counter | `scope` | drains that found their shard taken over by another worker |
//! | `outbox_database_errors_total` | counter | `operation` | failed database calls of the relay (`prepare`, `discover`, `drain`, `gauges`) |
//! | `outbox_handler_duration_seconds` | histogram | `category`, `scope` | how long a handler ran (failures included) |
//! | `outbox_delivery_lag_seconds` | histogram | `category`, `scope` | from the delivered message's creation (the database's clock) to its handler's start |
//! | `outbox_shard_drain_duration_seconds` | histogram | `scope` | how long a claimed shard's drain took |
//! | `outbox_shard_drain_rows` | histogram | `scope` | rows one drain acknowledged |
//! | `outbox_pending_messages` | gauge | | pending messages |
//! | `outbox_oldest_pending_age_seconds` | gauge | | age of the oldest pending message (0 when none) |
//! | `outbox_shards` | gauge | `state` | shards with pending messages by state: `due`, `in_flight`, `backoff`, `parked`, `paused` |
//! | `outbox_dead_letters` | gauge | | dead letters kept |
//! | `outbox_breaker_open` | gauge | `breaker` | 1 while a sink's [breaker](crate::sink::Breaker) is open (its broker unreachable), 0 once it closed |
//! | `outbox_breaker_openings_total` | counter | `breaker` | times a breaker opened |
//! | `outbox_backfill_rows_total` | counter | `model` | rows a backfill walked (each written its outboxes) |
//! | `outbox_backfill_errors_total` | counter | `model` | backfill ticks that failed (the batch rolled back) |
//! | `outbox_backfill_rows_walked` | gauge | `model` | rows the model's current (or last) walk has walked |
//! | `outbox_backfill_target_version` | gauge | `model` | the version an operator started the model's backfill to |
//! | `outbox_backfill_done_version` | gauge | `model` | the highest version whose walk completed |
//! | `outbox_backfill_pace_rows` | gauge | | the rows a backfill tick may walk now, per model: the budget, or less while live messages wait longer |
//! | `outbox_inbox_received_total` | counter | `consumer` | messages a consumer's inbox received, first or duplicate (counted at the record; a rollback after it does not take it back) |
//! | `outbox_inbox_duplicates_total` | counter | `consumer` | messages a consumer's inbox had recorded already: redeliveries it skipped |
//! | `outbox_inbox_handler_failures_total` | counter | `consumer`, `category` | attempts of a [`Consumer`](crate::inbox::Consumer)'s handlers that failed (each retried in place, or dead-lettered) |
//! | `outbox_inbox_dead_letters_total` | counter | `consumer`, `category` | messages a consumer recorded in `outbox_inbox_dead_letters` (`category` empty for a message without one) |
//! | `outbox_inbox_lag` | gauge | `consumer` | messages the broker holds for a consumer, not yet delivered (where the broker says: JetStream) |
//!
//! The backfill gauges are set by the relay that walks a batch, from the watermark it wrote.
//!
//! The gauges come from one query that [`Relay::run`](crate::Relay::run) makes every
//! [`gauge_interval`](crate::RelayConfigBuilder::gauge_interval) (or
//! [`Relay::refresh_gauges`](crate::Relay::refresh_gauges) on demand); every relay of a
//! deployment reports the same values, so aggregate them with `max`, not `sum`.
//!
//! [`describe`] gives a recorder each metric's description and unit.
//! [`Relay::run`](crate::Relay::run) reports every counter of its registry's categories and
//! scopes at 0 when it starts ([`register`]), so that a counter is in a scrape before its first
//! event and a `rate` or `increase` sees that event.

use std::time::{Duration, SystemTime};

use metrics::{Counter, Histogram, Unit};

use crate::backfill::{BackfillBatch, BackfillOutcome};
use crate::hashed::Map;
use crate::model::{CategoryId, Message, ScopeId};
use crate::store::OutboxStatus;

/// Messages inserted (counter; `category`, `scope`).
pub const MESSAGES_WRITTEN: &str = "outbox_messages_written_total";
/// Handler calls that succeeded (counter; `category`, `scope`).
pub const DELIVERIES: &str = "outbox_deliveries_total";
/// Deliveries that failed (counter; `category`, `scope`, `kind`).
pub const HANDLER_FAILURES: &str = "outbox_handler_failures_total";
/// Shard heads found failing before any handler ran: a category this binary does not know,
/// a row that does not decode, a scope that is not the category's (counter; `scope`,
/// `kind`: one of [`HEAD_FAILURE_KINDS`]).
pub const HEAD_FAILURES: &str = "outbox_head_failures_total";
/// The kinds of the [`HEAD_FAILURES`] counter.
pub const HEAD_FAILURE_KINDS: [&str; 3] = ["unknown_category", "undecodable", "scope_mismatch"];
/// Rows deleted after their delivery (counter; `scope`).
pub const ROWS_ACKNOWLEDGED: &str = "outbox_rows_acknowledged_total";
/// Rows a delivery covered without delivering them (counter; `category`, `scope`).
pub const ROWS_COALESCED: &str = "outbox_rows_coalesced_total";
/// 1 while a sink's breaker is open, 0 once it closed (gauge; `breaker`).
pub const BREAKER_OPEN: &str = "outbox_breaker_open";
/// Times a sink's breaker opened (counter; `breaker`).
pub const BREAKER_OPENINGS: &str = "outbox_breaker_openings_total";
/// Rows set aside as dead letters (counter; `category`, `scope`).
pub const DEAD_LETTERED: &str = "outbox_dead_lettered_total";
/// Drains that lost their lease to another worker (counter; `scope`).
pub const LEASE_LOSSES: &str = "outbox_lease_losses_total";
/// Failed database calls of the relay (counter; `operation`).
pub const DATABASE_ERRORS: &str = "outbox_database_errors_total";
/// How long handlers ran (histogram, seconds; `category`, `scope`).
pub const HANDLER_DURATION: &str = "outbox_handler_duration_seconds";
/// From a message's creation to its handler's start (histogram, seconds; `category`, `scope`).
pub const DELIVERY_LAG: &str = "outbox_delivery_lag_seconds";
/// How long shard drains took (histogram, seconds; `scope`).
pub const DRAIN_DURATION: &str = "outbox_shard_drain_duration_seconds";
/// Rows each drain acknowledged (histogram; `scope`).
pub const DRAIN_ROWS: &str = "outbox_shard_drain_rows";
/// How long the database's cleanup horizon has been held ([`Horizon`](crate::admin::Horizon);
/// gauge, seconds; 0 when nothing holds it or the store cannot tell).
pub const HORIZON_AGE: &str = "outbox_horizon_age_seconds";
/// Pending messages (gauge).
pub const PENDING_MESSAGES: &str = "outbox_pending_messages";
/// Age of the oldest pending message (gauge, seconds).
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Shards with pending messages by `state` (gauge).
pub const SHARDS: &str = "outbox_shards";
/// Dead letters kept (gauge).
pub const DEAD_LETTERS: &str = "outbox_dead_letters";
/// Rows a backfill walked (counter; `model`).
pub const BACKFILL_ROWS: &str = "outbox_backfill_rows_total";
/// Backfill ticks that failed (counter; `model`).
pub const BACKFILL_ERRORS: &str = "outbox_backfill_errors_total";
/// Rows the current (or last) walk of a model's backfill walked (gauge; `model`).
pub const BACKFILL_ROWS_WALKED: &str = "outbox_backfill_rows_walked";
/// The version a model's backfill was started to (gauge; `model`).
pub const BACKFILL_TARGET_VERSION: &str = "outbox_backfill_target_version";
/// The highest version whose backfill walk completed (gauge; `model`).
pub const BACKFILL_DONE_VERSION: &str = "outbox_backfill_done_version";
/// Gauge: the rows a running relay's backfill tick may walk now, per model: its
/// [`backfill_budget`](crate::RelayConfigBuilder::backfill_budget), or less while live
/// messages wait longer for the walk.
pub const BACKFILL_PACE: &str = "outbox_backfill_pace_rows";

/// Messages a consumer's [`Inbox`](crate::inbox::Inbox) received, first or duplicate
/// (counter; `consumer`).
pub const INBOX_RECEIVED: &str = "outbox_inbox_received_total";
/// Messages a consumer's inbox found it had applied already (counter; `consumer`).
pub const INBOX_DUPLICATES: &str = "outbox_inbox_duplicates_total";
/// Attempts of a [`Consumer`](crate::inbox::Consumer)'s handlers that failed (counter;
/// `consumer`, `category`).
pub const INBOX_HANDLER_FAILURES: &str = "outbox_inbox_handler_failures_total";
/// Messages a [`Consumer`](crate::inbox::Consumer) recorded as dead letters (counter;
/// `consumer`, `category`: empty for a message without one).
pub const INBOX_DEAD_LETTERS: &str = "outbox_inbox_dead_letters_total";
/// Messages the broker holds for a consumer, not yet delivered, where the broker says (gauge;
/// `consumer`).
pub const INBOX_LAG: &str = "outbox_inbox_lag";

/// The operations of the [`DATABASE_ERRORS`] counter's `operation` label.
pub const DATABASE_OPERATIONS: [&str; 4] = ["prepare", "discover", "drain", "gauges"];

/// The states of the [`SHARDS`] gauge's `state` label.
pub const SHARD_STATES: [&str; 5] = ["due", "in_flight", "backoff", "parked", "paused"];

/// Gives the installed recorder every metric's description and unit (call it once, after
/// installing the recorder; the metrics are reported without it too).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(MESSAGES_WRITTEN, Unit::Count, "Outbox messages inserted");
    describe_counter!(DELIVERIES, Unit::Count, "Handler calls that succeeded");
    describe_counter!(
        HANDLER_FAILURES,
        Unit::Count,
        "Deliveries that failed, by kind"
    );
    describe_counter!(
        HEAD_FAILURES,
        Unit::Count,
        "Shard heads found failing before any handler ran, by kind"
    );
    describe_counter!(
        ROWS_ACKNOWLEDGED,
        Unit::Count,
        "Outbox rows deleted after their delivery"
    );
    describe_counter!(
        ROWS_COALESCED,
        Unit::Count,
        "Outbox rows covered by a delivery of a newer row of their group"
    );
    describe_counter!(DEAD_LETTERED, Unit::Count, "Rows set aside as dead letters");
    describe_counter!(
        LEASE_LOSSES,
        Unit::Count,
        "Drains whose shard another worker took over"
    );
    describe_counter!(
        DATABASE_ERRORS,
        Unit::Count,
        "Failed database calls of the relay"
    );
    describe_histogram!(HANDLER_DURATION, Unit::Seconds, "How long handlers ran");
    describe_histogram!(
        DELIVERY_LAG,
        Unit::Seconds,
        "From a message's creation to its handler's start"
    );
    describe_histogram!(DRAIN_DURATION, Unit::Seconds, "How long shard drains took");
    describe_histogram!(
        DRAIN_ROWS,
        Unit::Count,
        "Rows each shard drain acknowledged"
    );
    describe_gauge!(PENDING_MESSAGES, Unit::Count, "Pending outbox messages");
    describe_gauge!(
        BREAKER_OPEN,
        Unit::Count,
        "1 while a sink's breaker is open (its broker unreachable)"
    );
    describe_counter!(
        BREAKER_OPENINGS,
        Unit::Count,
        "Times a sink's breaker opened"
    );
    describe_gauge!(
        HORIZON_AGE,
        Unit::Seconds,
        "How long the oldest transaction, slot or standby holding back the database's cleanup of deleted rows has held it"
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending outbox message"
    );
    describe_gauge!(
        SHARDS,
        Unit::Count,
        "Shards with pending messages, by state"
    );
    describe_gauge!(DEAD_LETTERS, Unit::Count, "Dead letters kept");
    describe_counter!(BACKFILL_ROWS, Unit::Count, "Rows a backfill walked");
    describe_counter!(
        INBOX_RECEIVED,
        Unit::Count,
        "Messages a consumer's inbox received"
    );
    describe_counter!(
        INBOX_DUPLICATES,
        Unit::Count,
        "Messages a consumer's inbox had applied already"
    );
    describe_counter!(
        INBOX_HANDLER_FAILURES,
        Unit::Count,
        "Attempts of a consumer's handlers that failed"
    );
    describe_counter!(
        INBOX_DEAD_LETTERS,
        Unit::Count,
        "Messages a consumer recorded as dead letters"
    );
    describe_gauge!(
        INBOX_LAG,
        Unit::Count,
        "Messages the broker holds for a consumer, not yet delivered"
    );
    describe_counter!(BACKFILL_ERRORS, Unit::Count, "Backfill ticks that failed");
    describe_gauge!(
        BACKFILL_ROWS_WALKED,
        Unit::Count,
        "Rows the current walk of a model's backfill walked"
    );
    describe_gauge!(
        BACKFILL_TARGET_VERSION,
        Unit::Count,
        "The version a model's backfill was started to"
    );
    describe_gauge!(
        BACKFILL_DONE_VERSION,
        Unit::Count,
        "The highest version whose backfill walk completed"
    );
    describe_gauge!(
        BACKFILL_PACE,
        Unit::Count,
        "The rows a backfill tick may walk now, per model, paced by live latency"
    );
}

/// Reports every counter at 0 for each category and scope of `registry` (and each database
/// operation), so that they are in a scrape before their first event: what
/// [`Relay::run`](crate::Relay::run) does when it starts. Counters already counting keep
/// their values.
pub fn register(registry: &crate::Registry) {
    for info in registry.categories() {
        let (category, scope) = (info.identity.name, info.identity.scope_name);
        for name in [MESSAGES_WRITTEN, DELIVERIES, ROWS_COALESCED, DEAD_LETTERED] {
            metrics::counter!(name, "category" => category, "scope" => scope).increment(0);
        }
        for name in [ROWS_ACKNOWLEDGED, LEASE_LOSSES] {
            metrics::counter!(name, "scope" => scope).increment(0);
        }
        for kind in HEAD_FAILURE_KINDS {
            metrics::counter!(HEAD_FAILURES, "scope" => scope, "kind" => kind).increment(0);
        }
    }
    for operation in DATABASE_OPERATIONS {
        metrics::counter!(DATABASE_ERRORS, "operation" => operation).increment(0);
    }
    for model in registry.backfill_models() {
        for name in [BACKFILL_ROWS, BACKFILL_ERRORS] {
            metrics::counter!(name, "model" => model.name).increment(0);
        }
    }
}

/// One tick of a model's backfill: the rows it walked, and the gauges from the watermark.
pub(crate) fn backfilled(batch: &BackfillBatch) {
    let model = batch.model;
    if let BackfillOutcome::Walked { rows, .. } = batch.outcome {
        metrics::counter!(BACKFILL_ROWS, "model" => model).increment(rows as u64);
    }
    if let Some(state) = &batch.state {
        metrics::gauge!(BACKFILL_ROWS_WALKED, "model" => model).set(state.rows_walked as f64);
        metrics::gauge!(BACKFILL_TARGET_VERSION, "model" => model)
            .set(f64::from(state.target_version));
        metrics::gauge!(BACKFILL_DONE_VERSION, "model" => model).set(f64::from(state.done_version));
    }
}

/// The rows a backfill tick may walk now, per model (see
/// [`backfill_paced`](crate::RelayConfigBuilder::backfill_paced)).
pub(crate) fn backfill_pace(rows: usize) {
    metrics::gauge!(BACKFILL_PACE).set(rows as f64);
}

/// A failed tick of a model's backfill.
pub(crate) fn backfill_failed(model: &'static str) {
    metrics::counter!(BACKFILL_ERRORS, "model" => model).increment(1);
}

/// Counts `messages` as written: one increment per category and scope met.
pub fn record_written(messages: &[Message]) {
    let mut run: Option<(&Message, u64)> = None;
    for message in messages {
        match &mut run {
            Some((first, count)) if same_category(first, message) => *count += 1,
            _ => {
                if let Some((first, count)) = run.take() {
                    written(first, count);
                }
                run = Some((message, 1));
            }
        }
    }
    if let Some((first, count)) = run {
        written(first, count);
    }
}

fn same_category(a: &Message, b: &Message) -> bool {
    a.category() == b.category() && a.shard().scope == b.shard().scope
}

fn written(message: &Message, count: u64) {
    metrics::counter!(
        MESSAGES_WRITTEN,
        "category" => message.category_name(),
        "scope" => message.scope_name(),
    )
    .increment(count);
}

/// The handles a relay reports through, resolved once (at its first delivery) for each
/// category and scope of its registry: a delivery then costs atomic adds, not a lookup of
/// each metric by name and labels in the recorder.
pub(crate) struct RelayMetrics {
    categories: Map<CategoryId, CategoryMetrics>,
    scopes: Map<ScopeId, ScopeMetrics>,
}

impl RelayMetrics {
    pub(crate) fn new(registry: &crate::Registry) -> Self {
        let categories = registry
            .categories()
            .into_iter()
            .map(|info| {
                (
                    info.identity.id,
                    CategoryMetrics::new(info.identity.name, info.identity.scope_name),
                )
            })
            .collect();
        let scopes = registry
            .categories()
            .into_iter()
            .map(|info| {
                (
                    info.identity.scope,
                    ScopeMetrics::new(info.identity.scope_name),
                )
            })
            .collect();
        Self { categories, scopes }
    }

    /// A known category's handles.
    pub(crate) fn category(&self, id: CategoryId) -> Option<&CategoryMetrics> {
        self.categories.get(&id)
    }

    /// A shard head that failed before any handler ran (`kind`, one of
    /// [`HEAD_FAILURE_KINDS`]): labelled with its scope's name, or its number for a scope this
    /// binary does not know.
    pub(crate) fn head_failed(&self, scope: ScopeId, kind: &'static str) {
        let scope = self
            .scopes
            .get(&scope)
            .map_or_else(|| scope.0.to_string(), |metrics| metrics.scope.to_owned());
        metrics::counter!(HEAD_FAILURES, "scope" => scope, "kind" => kind).increment(1);
    }

    /// A drain's end: its duration and rows, and whether it lost its lease.
    pub(crate) fn drained(&self, scope: ScopeId, took: Duration, rows: u64, lost_lease: bool) {
        let Some(metrics) = self.scopes.get(&scope) else {
            return;
        };
        metrics.drain_duration.record(took.as_secs_f64());
        metrics.drain_rows.record(rows as f64);
        if rows > 0 {
            metrics.acknowledged.increment(rows);
        }
        if lost_lease {
            metrics.lease_losses.increment(1);
        }
    }
}

/// A scope's handles.
struct ScopeMetrics {
    scope: &'static str,
    acknowledged: Counter,
    lease_losses: Counter,
    drain_duration: Histogram,
    drain_rows: Histogram,
}

impl ScopeMetrics {
    fn new(scope: &'static str) -> Self {
        Self {
            scope,
            acknowledged: metrics::counter!(ROWS_ACKNOWLEDGED, "scope" => scope),
            lease_losses: metrics::counter!(LEASE_LOSSES, "scope" => scope),
            drain_duration: metrics::histogram!(DRAIN_DURATION, "scope" => scope),
            drain_rows: metrics::histogram!(DRAIN_ROWS, "scope" => scope),
        }
    }
}

/// A category's handles, and its labels for the rarer reports (failures by kind, dead
/// letters), which are looked up when they happen.
pub(crate) struct CategoryMetrics {
    category: &'static str,
    scope: &'static str,
    deliveries: Counter,
    coalesced: Counter,
    duration: Histogram,
    lag: Histogram,
}

impl CategoryMetrics {
    fn new(category: &'static str, scope: &'static str) -> Self {
        let labels = [("category", category), ("scope", scope)];
        Self {
            category,
            scope,
            deliveries: metrics::counter!(DELIVERIES, &labels),
            coalesced: metrics::counter!(ROWS_COALESCED, &labels),
            duration: metrics::histogram!(HANDLER_DURATION, &labels),
            lag: metrics::histogram!(DELIVERY_LAG, &labels),
        }
    }

    pub(crate) fn delivered(&self, rows: u64, lag: Duration, took: Duration) {
        self.deliveries.increment(1);
        if rows > 1 {
            self.coalesced.increment(rows - 1);
        }
        self.timed(lag, took);
    }

    pub(crate) fn failed(&self, kind: &'static str, lag: Duration, took: Duration) {
        metrics::counter!(
            HANDLER_FAILURES,
            "category" => self.category,
            "scope" => self.scope,
            "kind" => kind,
        )
        .increment(1);
        self.timed(lag, took);
    }

    /// The handler's duration, and the lag from the message's creation to its start.
    fn timed(&self, lag: Duration, took: Duration) {
        self.duration.record(took.as_secs_f64());
        self.lag.record(lag.as_secs_f64());
    }

    pub(crate) fn dead_lettered(&self, rows: u64) {
        metrics::counter!(DEAD_LETTERED, "category" => self.category, "scope" => self.scope)
            .increment(rows);
    }
}

/// `span`, or no span where no subscriber records it: what it instruments then does not enter
/// and leave it at every poll (with `tracing`'s `log` feature, which sqlx turns on, each enter
/// and exit of a span nobody records still asks whether to log it).
pub(crate) fn recorded(span: tracing::Span) -> tracing::Span {
    if span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

/// A breaker opened.
pub(crate) fn breaker_opened(breaker: &str) {
    let labels = [("breaker", breaker.to_owned())];
    metrics::gauge!(BREAKER_OPEN, &labels).set(1.0);
    metrics::counter!(BREAKER_OPENINGS, &labels).increment(1);
}

/// A breaker closed.
pub(crate) fn breaker_closed(breaker: &str) {
    metrics::gauge!(BREAKER_OPEN, &[("breaker", breaker.to_owned())]).set(0.0);
}

/// A failed database call of the relay.
pub(crate) fn database_error(operation: &'static str) {
    metrics::counter!(DATABASE_ERRORS, "operation" => operation).increment(1);
}

/// Sets the gauges from one reading of the outbox's state.
pub(crate) fn gauges(status: &OutboxStatus, now: SystemTime) {
    metrics::gauge!(PENDING_MESSAGES).set(status.pending_messages as f64);
    let age = status
        .oldest_pending_at
        .and_then(|at| now.duration_since(at).ok())
        .unwrap_or_default();
    metrics::gauge!(OLDEST_PENDING_AGE).set(age.as_secs_f64());
    let counts = [
        status.shards_due,
        status.shards_in_flight,
        status.shards_in_backoff,
        status.shards_parked,
        status.shards_paused,
    ];
    for (state, count) in SHARD_STATES.into_iter().zip(counts) {
        metrics::gauge!(SHARDS, "state" => state).set(count as f64);
    }
    metrics::gauge!(DEAD_LETTERS).set(status.dead_letters as f64);
    let held = status
        .horizon
        .as_ref()
        .and_then(|horizon| horizon.held_for(now))
        .unwrap_or_default();
    metrics::gauge!(HORIZON_AGE).set(held.as_secs_f64());
}

/// Counts a message `consumer`'s inbox received, and whether it was a duplicate.
pub(crate) fn record_received(consumer: &str, duplicate: bool) {
    metrics::counter!(INBOX_RECEIVED, "consumer" => consumer.to_owned()).increment(1);
    if duplicate {
        metrics::counter!(INBOX_DUPLICATES, "consumer" => consumer.to_owned()).increment(1);
    }
}

/// Counts a failed attempt of `consumer`'s handler of `category`.
pub(crate) fn record_consumer_failure(consumer: &str, category: &'static str) {
    metrics::counter!(INBOX_HANDLER_FAILURES, "consumer" => consumer.to_owned(), "category" => category)
        .increment(1);
}

/// Counts a dead letter of `consumer`.
pub(crate) fn record_consumer_dead_letter(consumer: &str, category: &str) {
    metrics::counter!(INBOX_DEAD_LETTERS, "consumer" => consumer.to_owned(), "category" => category.to_owned())
        .increment(1);
}

/// Sets `consumer`'s lag.
pub(crate) fn record_consumer_lag(consumer: &str, pending: u64) {
    #[allow(clippy::cast_precision_loss)]
    metrics::gauge!(INBOX_LAG, "consumer" => consumer.to_owned()).set(pending as f64);
}
