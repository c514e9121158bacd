//! Failures: the shard backs off, others go on, unknown categories park.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::memory::MemoryStore;
use outbox_core::{BoxError, Category, CategoryId, Delivery, DeliveryError};

use super::{Recorder, Update, clocked, config, msg, relay, shard};

/// A handler of `Update` that records, and fails while `failures` is above zero (counting it
/// down) for object 1.
fn failing(
    recorder: &Recorder,
    failures: &Arc<AtomicU32>,
) -> impl outbox_core::handler::Handler<Delivery<Update>> {
    let (recorder, failures) = (recorder.clone(), Arc::clone(failures));
    move |delivery: Delivery<Update>| {
        recorder.record(&delivery);
        let fail = delivery.object_identifier == 1
            && failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        async move {
            if fail {
                return Err::<(), BoxError>("deliberate failure".into());
            }
            Ok(())
        }
    }
}

/// S18: a failure stops its shard only: the groups before it are acknowledged, it and the
/// later ones stay, other shards carry on.
#[tokio::test]
async fn a_failure_stops_only_its_shard() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let failures = Arc::new(AtomicU32::new(u32::MAX));
    let relay = relay(
        &store,
        recorder.registry_with(failing(&recorder, &failures)),
        config("s18"),
    );
    let ids = store.write_all(&[
        msg::<Update>(1, 0, 1),
        msg::<Update>(1, 1, 2),
        msg::<Update>(1, 2, 3),
        msg::<Update>(2, 3, 4),
    ]);

    let report = relay.drain().await.expect("drain");
    let mut triples = recorder.triples();
    triples.sort_unstable();
    assert_eq!(triples, [(1, 0, 1), (1, 1, 2), (2, 3, 4)]);
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].shard, shard(1));
    let left: Vec<_> = store
        .pending_messages(10)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(left, ids[1..3], "the failed group and the one after it");
}

/// S19: a failed shard backs off (2 s, then 4 s: doubling), is not due meanwhile, is due once
/// the delay passes, or at once when a newer message arrives (without resetting the doubling);
/// the attempt is visible to the handler; success clears the shard's state.
#[tokio::test]
async fn a_failed_shard_backs_off_and_retries() {
    let (store, clock) = clocked();
    let recorder = Recorder::default();
    let failures = Arc::new(AtomicU32::new(3));
    let relay = relay(
        &store,
        recorder.registry_with(failing(&recorder, &failures)),
        config("s19"),
    );
    store.write(&msg::<Update>(1, 1, 1));

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures[0].retry_in, Duration::from_secs(2));
    let state = store.shard_states().await.unwrap().remove(0);
    assert_eq!(state.attempts, 1);
    assert_eq!(state.retry_at, Some(clock.now() + Duration::from_secs(2)));
    assert!(
        state
            .last_error
            .is_some_and(|error| error.contains("deliberate failure"))
    );

    clock.advance(Duration::from_millis(1999));
    assert_eq!(
        relay.drain().await.unwrap().shards_claimed,
        0,
        "backing off"
    );
    clock.advance(Duration::from_millis(1));
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        report.failures[0].retry_in,
        Duration::from_secs(4),
        "doubled"
    );

    // A newer message: due at once, and the doubling goes on.
    store.write(&msg::<Update>(1, 2, 2));
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        report.shards_claimed, 1,
        "a new message makes the shard due"
    );
    assert_eq!(report.failures[0].retry_in, Duration::from_secs(8));

    clock.advance(Duration::from_secs(8));
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let attempts: Vec<u32> = recorder.seen().iter().map(|seen| seen.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4, 1], "the handler sees the attempt");
    assert!(store.pending_messages(10).await.unwrap().is_empty());
    assert!(
        store.shard_states().await.unwrap().is_empty(),
        "success clears the shard"
    );
}

/// S20: a row of a category this binary does not know parks its shard (never deleted, not
/// due again by time alone); a relay that knows the category resumes it at start.
#[tokio::test]
async fn an_unknown_category_parks_its_shard_until_a_binary_knows_it() {
    let (store, clock) = clocked();
    let old = Recorder::default();
    let old_relay = relay(&store, old.registry(), config("old"));
    store.write(&msg::<Update>(1, 1, 1));
    let unknown = store.insert_raw(&shard(1), CategoryId(99), 2, "3");
    store.write(&msg::<Update>(1, 3, 4));

    let report = old_relay.drain().await.expect("drain");
    assert_eq!(old.triples(), [(1, 1, 1)], "rows before it are delivered");
    assert!(matches!(
        report.failures[0].error,
        DeliveryError::UnknownCategory { message_id, category: CategoryId(99) } if message_id == unknown
    ));
    let state = store.shard_states().await.unwrap().remove(0);
    assert_eq!(state.parked_category, Some(CategoryId(99)));
    clock.advance(Duration::from_secs(1));
    assert_eq!(old_relay.drain().await.unwrap().shards_claimed, 0);
    assert_eq!(
        store.pending_messages(10).await.unwrap().len(),
        2,
        "nothing deleted"
    );

    struct Future;
    impl Category for Future {
        type Scope = super::Org;
        type Payload = u64;
        const ID: CategoryId = CategoryId(99);
        const NAME: &'static str = "future";
    }
    let new = Recorder::default();
    let registry = new
        .builder()
        .handle::<Future>(new.handler())
        .build()
        .unwrap();
    relay(&store, registry, config("new"))
        .drain()
        .await
        .expect("drain");
    assert_eq!(new.triples(), [(1, 2, 3), (1, 3, 4)]);
}

/// S21: a payload that does not deserialize is a precise failure naming the row, not a panic.
#[tokio::test]
async fn a_malformed_payload_is_a_precise_failure() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let bad = store.insert_raw(&shard(1), Update::ID, 1, r#""seven""#);
    let report = relay(&store, recorder.registry(), config("s21"))
        .drain()
        .await
        .expect("drain");
    assert!(matches!(
        &report.failures[0].error,
        DeliveryError::Payload { category: "update", message_id, .. } if *message_id == bad
    ));
    assert!(recorder.seen().is_empty());
}
