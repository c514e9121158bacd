//! Order, coalescing and budgets.

use outbox_core::admin::Admin;
use outbox_core::memory::MemoryStore;

use super::{Event, Gate, Recorder, Update, config, eventually, msg, relay, shard};

/// S10: groups in the order of their oldest row, each with its newest payload; events each
/// in write order; across reads smaller than the shard.
#[tokio::test]
async fn groups_are_delivered_in_order_of_their_oldest_row() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let config = config("order")
        .to_builder()
        .batch_size(2)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, recorder.registry(), config);
    store.write_all(&[
        msg::<Update>(1, 100, 1),
        msg::<Event>(1, 7, 2),
        msg::<Update>(1, 200, 3),
        msg::<Event>(1, 7, 4),
        msg::<Update>(1, 100, 5),
        msg::<Event>(1, 8, 6),
    ]);

    let report = relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [(1, 100, 5), (1, 7, 2), (1, 200, 3), (1, 7, 4), (1, 8, 6)]
    );
    assert_eq!((report.deliveries, report.rows_acknowledged), (5, 6));
    assert!(store.pending_messages(10).await.unwrap().is_empty());
}

/// S11: a group's rows coalesce to one delivery of the newest payload, even when the newest
/// lies beyond the rows read at once; every row of the group is acknowledged with it.
#[tokio::test]
async fn coalescing_delivers_the_newest_payload_once() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let config = config("coalesce")
        .to_builder()
        .batch_size(2)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, recorder.registry(), config);
    for seq in 1..=9 {
        store.write(&msg::<Update>(1, 1, seq));
    }
    store.write(&msg::<Update>(2, 1, 10));

    let report = relay.drain().await.expect("drain");
    let mut triples = recorder.triples();
    triples.sort_unstable();
    assert_eq!(triples, [(1, 1, 9), (2, 1, 10)]);
    assert_eq!((report.deliveries, report.rows_acknowledged), (2, 10));
}

/// A shard yields after its row budget (released, still due) so one hot shard cannot starve
/// the others; it stays in order across its claims.
#[tokio::test]
async fn the_row_budget_lets_other_shards_through() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let config = config("budget")
        .to_builder()
        .max_concurrent_shards(1)
        .shard_row_budget(10)
        .batch_size(5)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, recorder.registry(), config);
    let mut messages: Vec<_> = (0..40).map(|seq| msg::<Event>(1, 1, seq)).collect();
    messages.extend((2..=6).map(|id| msg::<Update>(id, 1, 100)));
    store.write_all(&messages);

    let report = relay.drain_shards(&[shard(1)]).await.expect("one drain");
    assert_eq!(report.deliveries, 10, "the budget");
    assert_eq!(report.yielded, [shard(1)], "the shard yielded, still due");
    assert!(report.rows_remain());

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.deliveries, 35);
    assert!(
        report.shards_claimed >= 8,
        "the hot shard was claimed again and again"
    );
    let seen = recorder.seen();
    let hot: Vec<usize> = (0..seen.len()).filter(|&i| seen[i].shard == 1).collect();
    let last_cold = (0..seen.len())
        .rfind(|&i| seen[i].shard != 1)
        .expect("cold");
    assert!(
        last_cold < hot[20],
        "the other shards were served before the hot shard's third budget: {seen:?}"
    );
    let order: Vec<u64> = hot.iter().map(|&i| seen[i].seq).collect();
    assert_eq!(order, (0..40).collect::<Vec<_>>(), "in order across claims");
    assert!(
        store.shard_states().await.unwrap().is_empty(),
        "no state left"
    );
}

/// A relay holding many shards reads the rows its handlers are about to take, not a batch of
/// every shard it holds: with one handler slot and batches of one row, at most two reads are
/// in memory at once. The shards held meanwhile read later, and so deliver the newest row of
/// their group, written while they waited, and never the older one.
#[tokio::test]
async fn held_shards_read_only_what_the_handlers_are_about_to_take() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let gate = Gate::new();
    let config = config("reads")
        .to_builder()
        .max_concurrent_shards(1)
        .batch_size(1)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config,
    );
    // Fast turns first: the relay then holds every due shard, not only as many as it has
    // slots.
    store.write_all(&(0..64).map(|n| msg::<Event>(100, n, 0)).collect::<Vec<_>>());
    relay.drain().await.expect("drain");
    let shards = 1..=9_i64;
    store.write_all(
        &shards
            .clone()
            .map(|n| msg::<Update>(n, 1, 1))
            .collect::<Vec<_>>(),
    );
    let draining = tokio::spawn({
        let relay = relay.clone();
        async move { relay.drain().await.expect("drain") }
    });
    gate.entered().await;
    eventually("every shard is held", || {
        store
            .states()
            .iter()
            .filter(|state| state.lease_owner.is_some())
            .count()
            == 9
    })
    .await;
    // Whatever a held shard would read, it has read by now (the store answers at once).
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    store.write_all(
        &shards
            .clone()
            .map(|n| msg::<Update>(n, 1, 2))
            .collect::<Vec<_>>(),
    );
    gate.open();
    draining.await.expect("the drain task");
    let seen = recorder.triples();
    let older = seen.iter().filter(|(_, _, seq)| *seq == 1).count();
    assert!(
        older <= 2,
        "only the shard in its handler and one more read before the newer rows: {seen:?}"
    );
    for n in shards {
        assert!(
            seen.contains(&(n, 1, 2)),
            "shard {n}'s newest row is delivered: {seen:?}"
        );
    }
}

/// A claim's shards are shared among the runtime's threads: handlers that hold their thread
/// (as handlers doing heavy work do) run on every thread at once, not one after the other on
/// the thread of the claim's task. (A handler holds its thread until another is inside too;
/// the first to wait 10 s in vain ends every wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_handlers_run_on_every_thread_of_the_runtime() {
    use std::sync::{Arc, Condvar, Mutex, PoisonError};
    use std::time::Duration;

    use outbox_core::{BoxError, Delivery};

    /// Handlers inside now, whether two were inside at once, and whether one waited in vain.
    #[derive(Default)]
    struct Inside {
        now: usize,
        met: bool,
        gave_up: bool,
    }
    let store = MemoryStore::new();
    let inside: Arc<(Mutex<Inside>, Condvar)> = Arc::default();
    let handler = {
        let inside = Arc::clone(&inside);
        move |_: Delivery<Update>| {
            let inside = Arc::clone(&inside);
            async move {
                let (lock, changed) = &*inside;
                let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
                state.now += 1;
                if state.now >= 2 {
                    state.met = true;
                    changed.notify_all();
                }
                let (mut state, waited) = changed
                    .wait_timeout_while(state, Duration::from_secs(10), |state| {
                        !state.met && !state.gave_up
                    })
                    .unwrap_or_else(PoisonError::into_inner);
                state.gave_up |= waited.timed_out();
                state.now -= 1;
                Ok::<(), BoxError>(())
            }
        }
    };
    let config = config("threads")
        .to_builder()
        .max_concurrent_shards(64)
        .claim_batch(64)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, Recorder::default().registry_with(handler), config);
    let messages: Vec<_> = (1..=64).map(|id| msg::<Update>(id, id, 1)).collect();
    store.write_all(&messages);

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.rows_acknowledged, 64);
    let met = inside.0.lock().unwrap_or_else(PoisonError::into_inner).met;
    assert!(met, "two handlers of one claim ran at once, on two threads");
}
