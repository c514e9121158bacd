//! The behaviour suite: the semantics of SPEC §5–§7, as one set of tests any backend runs.
//!
//! Each test is an `async fn` generic over a [`StoreBackend`] (the store and relay behaviours)
//! or a [`TestBackend`] (those that need a SQL database); [`conformance_tests!`] turns the whole
//! list into `#[test]` functions for one SQL backend, [`store_conformance_tests!`] the store and
//! relay part for any store:
//!
//! ```ignore
//! outbox_testkit::conformance_tests!(outbox_testkit::sqlite::SqliteBackend);
//! outbox_testkit::store_conformance_tests!(outbox_testkit::memory::MemoryBackend);
//! ```
//!
//! [`conformance_tests!`]: crate::conformance_tests
//! [`store_conformance_tests!`]: crate::store_conformance_tests
//! [`TestBackend`]: crate::TestBackend

mod backfill;
mod concurrency;
mod delivery;
mod deploys;
mod failure;
mod flush;
mod inbox;
mod models;
mod operations;
mod relay;
mod sinks;
mod telemetry;
mod write;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_core::admin::Admin;
use outbox_core::handler::Handler;
use outbox_core::store::{ClaimOptions, HandlerMode, PendingMessage, ShardState};
use outbox_core::{
    Backoff, BoxError, Category, Delivery, Id, Message, MessageId, RelayConfig, ShardKey,
};

pub use self::backfill::*;
pub use self::concurrency::*;
pub use self::delivery::*;
pub use self::deploys::*;
pub use self::failure::*;
pub use self::flush::*;
pub use self::inbox::*;
pub use self::models::*;
pub use self::operations::*;
pub use self::relay::*;
pub use self::sinks::*;
pub use self::telemetry::*;
pub use self::write::*;
use crate::backend::StoreBackend;
use crate::fixtures::{Note, Recorder};

/// Runs one conformance test on a fresh multi-threaded runtime.
pub fn run(test: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime for the test")
        .block_on(test);
}

/// Generates one `#[test]` per conformance behaviour for a [`TestBackend`]: the
/// [store and relay behaviours](crate::store_conformance_tests), and those that need a SQL
/// database (the caller's transactions, bulk statements, model tables, migrations, the
/// in-transaction handler mode).
///
/// [`TestBackend`]: crate::TestBackend
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty) => {
        $crate::store_conformance_tests!($backend);
        $crate::conformance_tests!(@each $backend;
            s01_writes_commit_and_roll_back_with_the_transaction,
            s02_flush_drains_exactly_the_shards_written,
            s03_deferred_scopes_and_rollbacks_flush_nothing,
            s05_bulk_write_is_one_statement,
            s16_in_transaction_handler_commits_with_the_acknowledgement,
            missing_migration_is_a_typed_error,
            models_replicate_while_present_and_delete_once_gone,
            models_are_read_in_the_claiming_transaction,
            model_writes_commit_and_roll_back_with_the_transaction,
            a_key_twice_in_one_model_write_is_refused,
            fan_out_models_reach_each_destination,
            unreadable_model_rows_are_precise_failures,
            older_binary_runs_on_a_newer_schema,
            error_chains_print_each_cause_once,
            malformed_metadata_is_a_precise_failure,
            a_committed_transaction_wakes_an_idle_relay,
            a_shard_woken_while_draining_is_drained_again,
            a_backfill_waits_for_its_start,
            a_backfill_walks_batches_in_key_order_to_completion,
            a_backfill_gives_way_to_the_backlog_and_never_stops_short,
            a_fan_out_backfill_reaches_the_destinations_each_row_names,
            a_failed_watermark_write_fails_its_batch,
            a_paused_backfill_resumes_where_it_stopped,
            concurrent_relays_never_walk_the_same_batch,
            the_relay_walks_a_started_backfill,
            the_inbox_records_each_message_once_per_consumer,
            a_consumer_applies_each_message_once_with_its_effect,
            a_failing_handler_is_retried_in_place_and_its_effect_rolled_back,
            a_message_failing_its_last_attempt_is_a_dead_letter,
            undecodable_messages_are_dead_letters_at_once,
            a_stopped_consumer_leaves_the_message_to_the_broker,
            a_consumers_retention_purges_its_own_records,
            a_consumer_built_wrong_is_refused_with_each_problem,
        );
        $crate::conformance_tests!(@captured $backend;
            models_of_many_shards_are_read_together,
        );
    };
    (@captured $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::$name::<$backend>();
            }
        )*
    };
    (@each $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::run($crate::conformance::$name::<$backend>());
            }
        )*
    };
}

/// Generates one `#[test]` per store and relay behaviour for a [`StoreBackend`]: delivery
/// order and coalescing, flushes, leases and takeovers, failures and backoff, budgets,
/// running and shutting down. What any [`Store`](outbox_core::store::Store) must pass, one without SQL included
/// (`outbox_testkit::store_conformance_tests!(outbox_testkit::memory::MemoryBackend)`).
#[macro_export]
macro_rules! store_conformance_tests {
    ($backend:ty) => {
        $crate::conformance_tests!(@each $backend;
            s02_flush_is_bounded_to_the_rows_at_commit,
            s02_failed_flush_is_typed_and_leaves_the_schedule,
            s02_flush_waits_for_a_shard_another_flush_holds,
            s02_flush_gives_up_on_a_held_shard_with_a_typed_error,
            s02_budgets_do_not_cut_a_flush_short,
            flush_due_leaves_cascades_for_the_next_pass,
            s04_scope_mismatch_is_rejected_before_the_database,
            s04_stored_row_with_a_mismatched_scope_backs_its_shard_off,
            s10_groups_in_order_of_oldest_row_with_newest_payload,
            s10_coalescing_reaches_beyond_one_read,
            s11_two_writes_to_one_group_are_one_call,
            s12_categories_and_shards_are_separate_groups,
            s13_row_written_during_delivery_survives,
            s14_non_coalescing_messages_in_write_order,
            a_sink_publishes_each_delivery_with_its_keys_and_headers,
            a_publisher_routes_encodes_and_prefixes_its_own_way,
            a_sink_takes_a_shards_groups_at_once_and_acknowledges_what_it_confirmed,
            what_a_broker_stored_after_a_refusal_is_not_published_again,
            a_refused_message_fails_only_its_shard,
            an_unreachable_sink_parks_its_shards_without_counting_attempts,
            a_running_relay_resumes_parked_shards_when_the_breaker_closes,
            heartbeats_are_listed_until_their_relay_leaves,
            a_running_relay_says_which_breakers_hold_its_shards,
            s15_concurrent_claims_grant_one_lease,
            s15_two_relays_share_shards_without_overlap,
            s15_claiming_many_shards_grants_each_once,
            shards_claimed_together_report_their_own_attempts_and_holders,
            s16_stale_worker_cannot_acknowledge,
            drained_shards_finished_together_are_each_fenced_by_their_lease,
            leases_extended_together_are_each_fenced_by_their_token,
            drained_shards_finished_together_count_only_rows_still_there,
            a_slow_shard_holds_back_no_other,
            a_shard_claimed_beside_a_slow_one_is_served_again_while_it_runs,
            held_shards_wait_their_turn_keeping_their_leases,
            a_stopping_relay_releases_the_shards_waiting_for_their_turn,
            a_handler_may_flush_what_it_writes,
            s16_a_long_handler_keeps_its_lease,
            a_worker_whose_lease_lapsed_delivers_nothing_more,
            s17_a_lapsed_claim_counts_as_an_attempt,
            s17_crashed_worker_is_resumed_in_order,
            s17_crash_between_delivery_and_acknowledgement_redelivers,
            s18_failure_stops_only_its_shard,
            s19_backoff_doubles_caps_and_is_visible,
            s20_unknown_category_parks_and_is_never_deleted,
            s21_malformed_payload_is_a_precise_failure,
            s24_handlers_cascade_into_new_outboxes,
            fan_out_destinations_drain_independently,
            wide_identifiers_are_shards_and_objects_of_their_own,
            budget_lets_other_shards_through,
            discovery_pages_visit_each_shard_once_in_key_order,
            run_delivers_new_writes_and_stops_gracefully,
            shutdown_deadline_abandons_stuck_shards,
            s22_failing_groups_block_their_shard_by_default,
            s22_a_group_is_dead_lettered_after_max_attempts_and_its_shard_goes_on,
            s22_dead_letters_are_listed_replayed_in_order_and_purged,
            s22_a_stale_worker_cannot_dead_letter,
            dead_letter_retention_purges_old_letters,
            s23_a_paused_shard_delivers_nothing_then_resumes_once_per_group,
            s23_scope_and_category_pauses_hold_their_shards,
            operators_see_status_shards_and_messages,
            s25_an_operator_sets_one_message_aside,
            s23_a_flush_does_not_wait_for_a_paused_shard,
            health_lag_counts_due_shards_only,
            metadata_and_creation_time_reach_the_handler,
        );
        $crate::conformance_tests!(@captured $backend;
            a_shard_a_commit_names_is_served_before_a_sweeps_backlog,
            a_held_shard_a_commit_names_is_served_before_the_rest_of_the_batch,
            telemetry_counts_writes_deliveries_and_coalescing,
            telemetry_reports_failures_dead_letters_and_gauges,
            telemetry_counts_heads_that_fail_before_a_handler,
            an_open_breaker_is_a_gauge_and_its_openings_a_counter,
        );
    };
}

/// A relay configuration for tests: quick polling, the default backoff (2 s doubling to 1 h,
/// jittered).
pub(crate) fn config(worker: &str) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .poll_interval(Duration::from_millis(50))
        .backoff(Backoff::default())
        .shutdown_deadline(Duration::from_secs(5))
        .build()
        .expect("a valid relay configuration")
}

/// Options of a leased claim by `worker`, for tests that claim shards themselves.
pub(crate) fn claim_options(worker: &str) -> ClaimOptions {
    ClaimOptions {
        worker: worker.to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    }
}

/// Writes `messages` and commits them together (on a SQL backend, in one transaction with a
/// business row).
pub(crate) async fn write<B: StoreBackend>(backend: &B, messages: &[Message]) -> Vec<MessageId> {
    backend
        .write(messages)
        .await
        .expect("write outbox messages")
}

/// Every pending message.
pub(crate) async fn pending<B: StoreBackend>(backend: &B) -> Vec<PendingMessage> {
    backend
        .store()
        .pending_messages(100_000)
        .await
        .expect("list pending messages")
}

/// The ids of every pending message, in order.
pub(crate) async fn pending_ids<B: StoreBackend>(backend: &B) -> Vec<MessageId> {
    pending(backend)
        .await
        .into_iter()
        .map(|row| row.id)
        .collect()
}

/// The recorded state of one shard.
pub(crate) async fn state_of<S: Admin>(store: &S, shard: &ShardKey) -> Option<ShardState> {
    store
        .shard_states()
        .await
        .expect("list shard states")
        .into_iter()
        .find(|state| &state.shard == shard)
}

/// An integer identifier (the fixtures' shards and objects are integers).
#[track_caller]
pub(crate) fn int(id: Id) -> i64 {
    i64::try_from(id).expect("an integer identifier")
}

/// Asserts that `at` lies `expected` from now, give or take a second and a half.
pub(crate) fn assert_in(at: Option<SystemTime>, expected: Duration, what: &str) {
    let at = at.unwrap_or_else(|| panic!("{what}: no time recorded"));
    let now = SystemTime::now();
    let lower = now + expected - Duration::from_millis(1500).min(expected);
    let upper = now + expected + Duration::from_millis(1500);
    assert!(
        at >= lower && at <= upper,
        "{what}: expected about {expected:?} from now, got {:?}",
        at.duration_since(now)
            .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64()),
    );
}

/// Holds handlers inside their delivery: each announces that it entered, then waits until the
/// gate opens. How a test steps a relay to an exact point, without sleeping.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    /// A closed gate, and the receiver of its entries.
    pub(crate) fn new() -> (Self, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let (entered, inside) = tokio::sync::mpsc::unbounded_channel();
        let gate = Self {
            entered,
            open: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        (gate, inside)
    }

    /// Announces the entry, then waits for the gate to open.
    pub(crate) async fn pass(&self) {
        let _ = self.entered.send(());
        let _open = self.open.acquire().await.expect("the gate is never closed");
    }

    /// Opens the gate for every waiting and later handler.
    pub(crate) fn open(&self) {
        self.open.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    }

    /// A handler that records each delivery with `recorder`, then passes this gate.
    pub(crate) fn recording<C: Category<Payload = Note>>(
        &self,
        recorder: &Recorder,
    ) -> impl Handler<Delivery<C>> + use<C> {
        let (recorder, gate) = (recorder.clone(), self.clone());
        move |delivery: Delivery<C>| {
            recorder.record(&delivery);
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok::<(), BoxError>(())
            }
        }
    }
}

/// Waits until `check` holds, failing the test after 15 s.
pub(crate) async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    eventually_async(what, async || check()).await;
}

/// Waits until `check` (which may read the database) holds, failing the test after 15 s.
pub(crate) async fn eventually_async(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
