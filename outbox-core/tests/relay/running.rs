//! The background relay: running, waking, outages and shutdown.

use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::memory::MemoryStore;
use outbox_core::{BoxError, Delivery, Relay, RunReport};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Gate, Recorder, Update, clocked, config, eventually, msg, relay, shard};

/// Runs `relay` until the returned sender fires.
fn running(relay: &Relay<MemoryStore>) -> (oneshot::Sender<()>, JoinHandle<RunReport>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let relay = relay.clone();
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("run")
    });
    (stop, task)
}

async fn stop(stop: oneshot::Sender<()>, task: JoinHandle<RunReport>) -> RunReport {
    stop.send(()).expect("the relay is running");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay stops promptly")
        .expect("relay task")
}

/// A running relay delivers what is written after it starts, woken by the store's commits
/// or by polling, and stops cleanly when asked, reporting what it did.
#[tokio::test]
async fn run_delivers_new_writes_and_stops_cleanly() {
    for wake_on_commit in [true, false] {
        let store = MemoryStore::new();
        let recorder = Recorder::default();
        let config = config("runner")
            .to_builder()
            .wake_on_commit(wake_on_commit)
            .build()
            .expect("a valid relay configuration");
        let relay = relay(&store, recorder.registry(), config);
        let (stopper, task) = running(&relay);

        store.write(&msg::<Update>(1, 1, 1));
        eventually("the first write is delivered", || {
            recorder.seen().len() == 1
        })
        .await;
        store.write_all(&[msg::<Update>(2, 2, 2), msg::<Update>(3, 3, 3)]);
        eventually("later writes are delivered", || recorder.seen().len() == 3).await;

        let report = stop(stopper, task).await;
        assert_eq!((report.deliveries, report.abandoned), (3, 0), "{report:?}");
        assert!(store.pending_messages(10).await.unwrap().is_empty());
    }
}

/// While a page of the sweep is read, the relay goes on listening: a message committed then
/// is delivered before the page is done. (Under a held vacuum horizon a page walks every row
/// acknowledged since the horizon began and can take seconds; live messages must not wait.)
#[tokio::test]
async fn a_slow_discovery_page_does_not_hold_back_live_messages() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let relay = relay(&store, recorder.registry(), config("slow-page"));
    let hold = store.hold_discovery();
    let (stopper, task) = running(&relay);
    hold.reached().await;
    store.write(&msg::<Update>(1, 1, 1));
    eventually("the message is delivered while the page is read", || {
        recorder.seen().len() == 1
    })
    .await;
    drop(hold);
    let report = stop(stopper, task).await;
    assert_eq!(report.deliveries, 1, "{report:?}");
}

/// Shutdown gives in-flight shards a deadline; a shard stuck past it is abandoned to its
/// lease, and delivered once the lease lapses: nothing is lost.
#[tokio::test]
async fn the_shutdown_deadline_abandons_a_stuck_shard() {
    let (store, clock) = clocked();
    let recorder = Recorder::default();
    let gate = Gate::new(); // never opened
    let config = config("stuck")
        .to_builder()
        .shutdown_deadline(Duration::from_millis(50))
        .build()
        .expect("a valid relay configuration");
    let stuck = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config,
    );
    let (stopper, task) = running(&stuck);
    store.write(&msg::<Update>(1, 1, 1));
    gate.entered().await;

    let report = stop(stopper, task).await;
    assert_eq!(report.abandoned, 1);
    assert_eq!(store.pending_messages(10).await.unwrap().len(), 1, "kept");

    let after = Recorder::default();
    let next = relay(&store, after.registry(), super::config("after"));
    assert_eq!(next.drain().await.unwrap().shards_claimed, 0, "leased");
    clock.advance(stuck.config().lease());
    next.drain().await.expect("drain");
    assert_eq!(after.seen()[0].attempt, 2, "redelivered as a retry");
}

/// A drain the database interrupts fails with the error and loses nothing; its lease is
/// released before the next drain looks for due shards, so that drain redelivers the shard at
/// once (as a retry) rather than after the lease lapses.
#[tokio::test]
async fn an_interrupted_drain_is_released_when_the_database_answers() {
    let recorder = acknowledgement_interrupted(1, "interrupted").await;
    let attempts: Vec<u32> = recorder.seen().iter().map(|seen| seen.attempt).collect();
    assert_eq!(attempts, [1, 2], "released at once, redelivered as a retry");
}

/// Shards that one claim's drains empty at once are acknowledged and released together; when
/// the database interrupts that acknowledgement, every one of them fails with it, loses
/// nothing and is released before the next drain, which redelivers each at once (as a retry).
#[tokio::test]
async fn shards_emptied_together_whose_acknowledgement_failed_are_each_released() {
    let recorder = acknowledgement_interrupted(3, "together").await;
    let mut retries: Vec<(i64, u32)> = recorder
        .seen()
        .iter()
        .filter(|seen| seen.attempt > 1)
        .map(|seen| (seen.shard, seen.attempt))
        .collect();
    retries.sort_unstable();
    assert_eq!(
        retries,
        [(1, 2), (2, 2), (3, 2)],
        "each redelivered as a retry"
    );
}

/// Writes a message on each of `shards` shards and drains them with a relay whose first
/// acknowledgement of them all fails: the drain fails with the error and loses nothing, and
/// the next drains every shard at once. Returns what the handler saw.
async fn acknowledgement_interrupted(shards: i64, worker: &str) -> Recorder {
    let (store, _clock) = clocked(); // leases never lapse by themselves here
    let recorder = Recorder::default();
    let handler = {
        let (store, recorder) = (store.clone(), recorder.clone());
        move |delivery: Delivery<Update>| {
            recorder.record(&delivery);
            if delivery.attempt == 1 {
                // The store's next operations: the shards' acknowledgements (set again by
                // each handler; a shard whose read comes after another's handler fails there).
                store.fail_next(shards as usize);
            }
            async { Ok::<(), BoxError>(()) }
        }
    };
    let relay = relay(&store, recorder.registry_with(handler), config(worker));
    for shard in 1..=shards {
        store.write(&msg::<Update>(shard, 1, 1));
    }

    let error = relay.drain().await.expect_err("the acknowledgement failed");
    assert!(error.is_unavailable(), "{error:?}");
    assert_eq!(
        store.pending_messages(10).await.unwrap().len(),
        shards as usize,
        "nothing lost"
    );
    // The next drain gives the leases up (they lapse now) before it looks for due shards, so
    // it redelivers the shards without waiting for the leases.
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        report.deliveries, shards as u64,
        "the first drain after the outage drains every shard"
    );
    assert!(store.pending_messages(10).await.unwrap().is_empty());
    recorder
}

/// The background relay rides out an outage: drains it interrupts are released once the
/// database answers again, and their shards are redelivered without waiting for the lease.
#[tokio::test]
async fn run_rides_out_an_outage() {
    let (store, _clock) = clocked();
    let recorder = Recorder::default();
    let gate = Gate::new();
    let relay = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config("outage"),
    );
    let (stopper, task) = running(&relay);
    store.write(&msg::<Update>(1, 1, 1));
    gate.entered().await;

    store.set_unavailable(true);
    gate.open();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        recorder.seen().len(),
        1,
        "nothing delivered during the outage"
    );
    store.set_unavailable(false);
    eventually("the interrupted shard is redelivered", || {
        recorder.seen().len() == 2
    })
    .await;
    eventually("and acknowledged", || {
        store.pending().is_empty() && store.states().is_empty()
    })
    .await;

    let report = stop(stopper, task).await;
    assert!(report.database_errors >= 2, "{report:?}");
    assert_eq!(recorder.seen()[1].attempt, 2);
    assert_eq!(recorder.seen()[1].shard, shard(1).shard_identifier);
}

/// `Relay::health` for the probes: not live before `run`; live and ready while it runs, with
/// the shards in flight, the last claim and acknowledgement; live but not ready while the
/// database does not answer, ready again when it does; the lag of the oldest due message by
/// the store's clock, not counting shards backing off.
#[tokio::test]
async fn health_tells_the_probes_what_they_need() {
    let (store, clock) = clocked();
    let recorder = Recorder::default();
    let gate = Gate::new();
    let relay = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config("health"),
    );
    let idle = relay.health().await;
    assert!(!idle.is_live() && !idle.is_ready(), "{idle:?}");
    assert!(idle.database_reachable);
    assert_eq!(
        (idle.oldest_due_lag, idle.last_claim_at, idle.last_ack_at),
        (None, None, None)
    );

    store.write(&msg::<Update>(1, 1, 1));
    clock.advance(Duration::from_secs(42));
    assert_eq!(
        relay.health().await.oldest_due_lag,
        Some(Duration::from_secs(42)),
        "by the store's clock"
    );

    let (stopper, task) = running(&relay);
    gate.entered().await;
    let busy = relay.health().await;
    assert!(busy.is_live() && busy.is_ready(), "{busy:?}");
    assert_eq!(busy.shards_in_flight, 1);
    assert!(busy.last_claim_at.is_some() && busy.last_ack_at.is_none());
    assert_eq!(
        busy.oldest_due_lag,
        Some(Duration::from_secs(42)),
        "in flight"
    );

    store.set_unavailable(true);
    let outage = relay.health().await;
    assert!(outage.is_live() && !outage.is_ready(), "{outage:?}");
    assert!(
        outage
            .database_error
            .as_deref()
            .is_some_and(|error| error.contains("database unavailable")),
        "{outage:?}"
    );
    store.set_unavailable(false);
    gate.open();
    eventually("the message is acknowledged", || store.pending().is_empty()).await;
    let done = relay.health().await;
    assert!(done.is_ready() && done.last_ack_at.is_some(), "{done:?}");
    assert_eq!((done.shards_in_flight, done.oldest_due_lag), (0, None));

    stop(stopper, task).await;
    assert!(!relay.health().await.is_live(), "stopped");
}
