//! Leases: fencing, takeovers, heartbeats.

use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::store::Store;
use outbox_core::store::{ClaimOptions, HandlerMode, ShardSession};

use super::{Gate, Recorder, Update, clocked, config, msg, relay, shard};

fn claim_options(worker: &str, lease: Duration) -> ClaimOptions {
    ClaimOptions {
        worker: worker.to_owned(),
        lease,
        mode: HandlerMode::Leased,
    }
}

/// S16: a worker whose lease lapsed and passed to another cannot acknowledge: it learns it
/// lost the shard, deletes nothing, and the new owner has a greater fencing token.
#[tokio::test]
async fn a_stale_worker_cannot_acknowledge() {
    let (store, clock) = clocked();
    let recorder = Recorder::default();
    let gate = Gate::new();
    let config = config("stale")
        .to_builder()
        .lease(Duration::from_secs(30))
        .build()
        .expect("a valid relay configuration");
    let stale = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config,
    );
    store.write(&msg::<Update>(1, 1, 1));
    let draining = tokio::spawn(async move { stale.drain().await });
    gate.entered().await;

    clock.advance(Duration::from_secs(30));
    let fresh = store
        .claim(&shard(1), &claim_options("fresh", Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the lapsed lease is taken over");
    gate.open();
    let report = draining.await.unwrap().expect("drain");
    assert_eq!(report.lost_leases, [shard(1)], "the stale worker learns it");
    assert_eq!(report.rows_acknowledged, 0, "and deletes nothing");
    assert_eq!(store.pending_messages(10).await.unwrap().len(), 1);
    assert_eq!(
        fresh.lease().attempts,
        1,
        "the lapsed claim counts as an attempt"
    );
    assert_eq!(fresh.lease().previous_owner.as_deref(), Some("stale"));
}

/// S17: a takeover redelivers the whole first read as retries (the worker that died may have
/// delivered any of it); once through, the next message is on its first attempt.
#[tokio::test]
async fn a_takeover_redelivers_the_first_read_as_retries() {
    let (store, clock) = clocked();
    store.write_all(&[
        msg::<Update>(1, 1, 1),
        msg::<Update>(1, 2, 2),
        msg::<Update>(1, 3, 3),
    ]);
    let lease = Duration::from_secs(30);
    let crashed = store
        .claim(&shard(1), &claim_options("crashed", lease))
        .await
        .unwrap();
    drop(crashed.expect("due")); // died without releasing
    let recorder = Recorder::default();
    let config = config("survivor")
        .to_builder()
        .shard_row_budget(1)
        .build()
        .expect("a valid relay configuration");
    let survivor = relay(&store, recorder.registry(), config);
    assert_eq!(
        survivor.drain().await.unwrap().shards_claimed,
        0,
        "leased until it lapses"
    );

    clock.advance(lease);
    survivor.drain().await.expect("drain");
    let attempts: Vec<u32> = recorder.seen().iter().map(|seen| seen.attempt).collect();
    assert_eq!(
        attempts,
        [2, 2, 2],
        "every group of the first read, past the budget"
    );
    store.write(&msg::<Update>(1, 4, 4));
    survivor.drain().await.expect("drain");
    assert_eq!(
        recorder.seen()[3].attempt,
        1,
        "a clean drain counts nothing"
    );
}

/// S16/S17: a handler slower than the lease keeps its shard: the relay extends the lease
/// beside it, so no other worker can take the shard over while it runs.
#[tokio::test(start_paused = true)]
async fn a_long_handler_keeps_its_lease() {
    let (store, clock) = clocked();
    let recorder = Recorder::default();
    let gate = Gate::new();
    let lease = Duration::from_secs(3);
    let config = config("slow")
        .to_builder()
        .lease(lease)
        .build()
        .expect("a valid relay configuration");
    let slow = relay(
        &store,
        recorder.registry_with(gate.handler(&recorder)),
        config,
    );
    store.write(&msg::<Update>(1, 1, 1));
    let draining = tokio::spawn(async move { slow.drain().await });
    gate.entered().await;

    // The heartbeat beats every third of the lease (tokio's paused clock); the store's clock
    // moves as fast. Without it the lease would lapse within three steps.
    for step in 0..9 {
        tokio::time::sleep(lease / 3).await;
        clock.advance(lease / 3);
        let other = store
            .claim(&shard(1), &claim_options("other", lease))
            .await
            .unwrap();
        assert!(
            other.is_none(),
            "step {step}: the live worker still holds its shard"
        );
    }
    gate.open();
    let report = draining.await.unwrap().expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 1);
}
