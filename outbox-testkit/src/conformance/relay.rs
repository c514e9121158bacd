//! The relay loop: budgets, running, waking and shutting down (SPEC §7).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Message, Relay, RunReport};

use outbox_core::admin::Admin;

use outbox_core::store::Store;
use tokio::sync::{Notify, oneshot};

use super::concurrency::Stuck;
use super::{config, eventually, pending, write};
use crate::backend::{Scoped, StoreBackend, TestBackend};
use crate::fixtures::{AuditEvent, OrgUpdate, Recorder, note, org_shard};

/// A shard drain yields after its row budget, so one hot shard cannot starve the others.
pub async fn budget_lets_other_shards_through<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = config("budget")
        .to_builder()
        .max_concurrent_shards(1)
        .shard_row_budget(10)
        .batch_size(5)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), recorder.registry(), config);

    let mut messages: Vec<_> = (0..40).map(|seq| note::<AuditEvent>(1, 1, seq)).collect();
    messages.extend((2..=6).map(|shard| note::<OrgUpdate>(shard, 1, 100)));
    backend.write(&messages).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.deliveries, 45);
    assert!(
        report.shards_claimed >= 9,
        "the hot shard was claimed repeatedly: {report:?}"
    );
    let seen = recorder.seen();
    let hot: Vec<usize> = (0..seen.len())
        .filter(|&i| seen[i].shard == org_shard(1))
        .collect();
    let last_cold = (0..seen.len())
        .rfind(|&i| seen[i].shard != org_shard(1))
        .expect("cold shards");
    assert!(
        last_cold < hot[10],
        "every other shard was served before the hot shard's 11th message"
    );
    let hot_order: Vec<u64> = hot.iter().map(|&i| seen[i].seq).collect();
    assert_eq!(
        hot_order,
        (0..40).collect::<Vec<_>>(),
        "the hot shard stays in order across claims"
    );
    assert!(pending(&backend).await.is_empty());
}

/// A running relay delivers what is written after it started (woken by commits where the
/// backend notifies, by polling otherwise) and stops when asked, reporting what it did.
pub async fn run_delivers_new_writes_and_stops_gracefully<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("runner"));
    let (stop, running) = run_until_stopped(&relay);

    write(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(2, 2, 2)],
    )
    .await;
    let seen = recorder.clone();
    eventually("the running relay delivers the first writes", || {
        seen.seen().len() == 2
    })
    .await;
    write(&backend, &[note::<OrgUpdate>(3, 3, 3)]).await;
    relay.wake();
    eventually("the running relay delivers later writes", || {
        seen.seen().len() == 3
    })
    .await;

    stop.send(()).expect("the relay is running");
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the relay stops promptly")
        .expect("relay task")
        .expect("run");
    assert_eq!(report.deliveries, 3);
    assert_eq!(report.abandoned, 0);
    assert!(pending(&backend).await.is_empty());
}

/// Shutdown gives in-flight shards a deadline; a shard stuck past it is abandoned to its
/// lease, and after the lease lapses another relay delivers it: nothing is lost.
pub async fn shutdown_deadline_abandons_stuck_shards<B: StoreBackend>() {
    let backend = B::create().await;
    let entered = Arc::new(Notify::new());
    let stuck_config = config("stuck")
        .to_builder()
        .lease(Duration::from_millis(500))
        .shutdown_deadline(Duration::from_millis(300))
        .build()
        .expect("a valid relay configuration");
    let stuck_relay = Relay::with_config(
        backend.store(),
        Recorder::new().registry_with::<OrgUpdate>(Stuck::new(Arc::clone(&entered))),
        stuck_config,
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        stuck_relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the handler started");

    stop.send(()).expect("the relay is running");
    let report = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the relay gives up at its deadline")
        .expect("relay task")
        .expect("run");
    assert_eq!(report.abandoned, 1);
    assert_eq!(
        pending(&backend).await.len(),
        1,
        "the abandoned message is kept"
    );

    tokio::time::sleep(Duration::from_millis(700)).await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("after"));
    relay.drain().await.expect("drain");
    assert_eq!(recorder.triples(), [("org_update", 1, 1)]);
    assert!(
        backend
            .store()
            .pending_messages(10)
            .await
            .expect("pending")
            .is_empty()
    );
}

/// The commit of the backend's outbox transaction wakes an idle relay of the same process on
/// the shards it wrote, deferred scopes included, with nothing sent inside the transaction; a
/// transaction rolled back wakes nothing that could be delivered. The relay polls only hourly,
/// so nothing else can find the messages.
pub async fn a_committed_transaction_wakes_an_idle_relay<B: TestBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = polling_hourly("woken", 1_000);
    // A store on a pool of its own, as a relay beside the writers would have.
    let relay = Relay::with_config(backend.connect_store().await, recorder.registry(), config);
    let (stop, running) = run_until_stopped(&relay);
    // Written at the top, in a deferred scope, in a scope rolled back; what is delivered.
    type Round = (Vec<Message>, Vec<Message>, Vec<Message>, &'static [u64]);
    let rounds: [Round; 3] = [
        (vec![note::<OrgUpdate>(1, 1, 1)], vec![], vec![], &[1]),
        (
            vec![note::<OrgUpdate>(2, 2, 2)],
            vec![note::<AuditEvent>(3, 3, 3)],
            vec![note::<OrgUpdate>(4, 4, 4)],
            &[2, 3],
        ),
        (vec![], vec![note::<OrgUpdate>(5, 5, 5)], vec![], &[5]),
    ];
    let mut expected = Vec::new();
    for (round, (top, deferred, rolled_back, delivered)) in rounds.iter().enumerate() {
        // Settle: the relay has finished the sweep after its last delivery and is idle.
        tokio::time::sleep(Duration::from_millis(200)).await;
        backend
            .write_scoped(
                Scoped {
                    top,
                    nested: &[],
                    deferred,
                    rolled_back,
                },
                true,
            )
            .await
            .expect("write and commit");
        expected.extend_from_slice(delivered);
        eventually(&format!("round {round} is delivered"), || {
            recorder.seen().len() >= expected.len()
        })
        .await;
    }
    let report = stopped(stop, running).await;
    let mut seen: Vec<u64> = recorder.seen().iter().map(|seen| seen.seq).collect();
    seen.sort_unstable();
    expected.sort_unstable();
    assert_eq!(seen, expected, "nothing rolled back was delivered");
    assert_eq!(report.deliveries, expected.len() as u64);
}

/// An idle relay woken on a shard drains it again when its drain ends with rows left: rows a
/// commit wrote to it while it was draining, and rows beyond the drain's budget. The relay
/// polls only hourly, so nothing else can find them.
pub async fn a_shard_woken_while_draining_is_drained_again<B: TestBackend>() {
    let backend = B::create().await;
    // Rows left by a commit during the drain (the budget holds them all), then by the budget.
    for (shard, budget) in [(1i64, 1_000usize), (2, 1)] {
        let recorder = Recorder::new();
        let config = polling_hourly("again", budget);
        let (entered, gate) = (
            Arc::new(Notify::new()),
            Arc::new(tokio::sync::Semaphore::new(0)),
        );
        let handler = {
            let (recorder, entered, gate) =
                (recorder.clone(), Arc::clone(&entered), Arc::clone(&gate));
            move |delivery: outbox_core::Delivery<OrgUpdate>| {
                recorder.record(&delivery);
                let first = delivery.payload.seq == 1;
                let (entered, gate) = (Arc::clone(&entered), Arc::clone(&gate));
                async move {
                    if first {
                        entered.notify_one();
                        gate.acquire().await.expect("the gate").forget();
                    }
                    Ok::<(), outbox_core::BoxError>(())
                }
            }
        };
        let relay = Relay::with_config(
            backend.connect_store().await,
            recorder.registry_with::<OrgUpdate>(handler),
            config,
        );
        let (stop, running) = run_until_stopped(&relay);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let commit = |messages: Vec<Message>| {
            let backend = &backend;
            async move {
                let top = messages;
                backend
                    .write_scoped(
                        Scoped {
                            top: &top,
                            nested: &[],
                            deferred: &[],
                            rolled_back: &[],
                        },
                        true,
                    )
                    .await
                    .expect("write and commit");
            }
        };
        commit(vec![note::<OrgUpdate>(shard, 1, 1)]).await;
        entered.notified().await;
        // The shard is draining, its handler held: three more rows.
        commit(vec![
            note::<OrgUpdate>(shard, 2, 2),
            note::<OrgUpdate>(shard, 3, 3),
            note::<OrgUpdate>(shard, 4, 4),
        ])
        .await;
        gate.add_permits(1);
        eventually(
            &format!("every row of shard {shard} is delivered (budget {budget})"),
            || recorder.seen().len() >= 4,
        )
        .await;
        let report = stopped(stop, running).await;
        let seen: Vec<u64> = recorder.seen().iter().map(|seen| seen.seq).collect();
        assert_eq!(seen, [1, 2, 3, 4], "in order, each once");
        assert_eq!(report.deliveries, 4);
    }
}

/// Stops a relay [`run_until_stopped`] runs: its report.
pub(super) async fn stopped(stop: oneshot::Sender<()>, running: Running) -> RunReport {
    let _ = stop.send(());
    running
        .await
        .expect("the relay task does not panic")
        .expect("the relay stops cleanly")
}

/// A test relay's configuration, polling only hourly (so that only a wake-up finds a new
/// message in time), with a row budget of `budget` per drain.
fn polling_hourly(worker: &str, budget: usize) -> outbox_core::RelayConfig {
    let hour = Duration::from_secs(3600);
    config(worker)
        .to_builder()
        .poll_interval(hour)
        .min_poll_interval(hour)
        .shard_row_budget(budget)
        .build()
        .expect("a valid relay configuration")
}

/// A relay running in a task of its own.
pub(super) type Running = tokio::task::JoinHandle<Result<RunReport, outbox_core::Error>>;

/// Runs `relay` in a task until the returned sender is sent to (or dropped).
pub(super) fn run_until_stopped<S: Store>(relay: &Relay<S>) -> (oneshot::Sender<()>, Running) {
    let (stop, stopped) = oneshot::channel::<()>();
    let relay = relay.clone();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    (stop, running)
}

/// A sweep's pages visit each shard with pending messages once, in key order (scope, then
/// identifier), at most `limit` a page, whatever mix of one-message and deeper shards the
/// page holds and wherever a page ends: a backend that reads a page's first rows in one pass
/// of the shard index and seeks past deeper shards must join the two without a gap or a
/// repeat. A shard another worker holds is visited but not due.
pub async fn discovery_pages_visit_each_shard_once_in_key_order<B: StoreBackend>() {
    use crate::fixtures::{UserUpdate, user_shard};
    let backend = B::create().await;
    let store = backend.store();
    let mut messages = Vec::new();
    let mut seq = 0;
    for (shard, depth) in [(1, 3), (2, 1), (3, 2), (4, 1), (5, 4), (6, 1)] {
        for _ in 0..depth {
            seq += 1;
            messages.push(note::<OrgUpdate>(shard, seq, seq));
        }
    }
    for (shard, depth) in [(1, 2), (2, 1)] {
        for _ in 0..depth {
            seq += 1;
            messages.push(note::<UserUpdate>(shard, seq, seq));
        }
    }
    write(&backend, &messages).await;
    let _held = store
        .claim(&org_shard(4), &super::claim_options("elsewhere"))
        .await
        .expect("claim")
        .expect("shard 4 claimed");
    let expected = vec![
        org_shard(1),
        org_shard(2),
        org_shard(3),
        org_shard(5),
        org_shard(6),
        user_shard(1),
        user_shard(2),
    ];
    for limit in 1..=9 {
        let (mut due, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = store
                .discover(after.as_ref(), limit)
                .await
                .expect("discover");
            assert!(page.due.len() <= limit, "limit {limit}: {page:?}");
            due.extend(page.due);
            pages += 1;
            assert!(pages <= 20, "limit {limit}: the sweep does not end");
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(due, expected, "limit {limit}");
    }
}
