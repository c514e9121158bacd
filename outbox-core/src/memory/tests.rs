//! The in-memory store's own semantics, operation by operation (the relay's behaviour on it is
//! tested in `relay::tests`).

use std::time::Duration;

use super::{ManualClock, MemoryStore};
use crate::error::Error;
use crate::model::{CategoryId, MessageId, ScopeId, ShardKey};
use crate::store::{
    Acknowledgement, Admin, ClaimOptions, Failure, GroupKey, HandlerMode, Outcome, ShardSession,
    Store,
};

fn shard(id: i64) -> ShardKey {
    ShardKey::local(ScopeId(1), id)
}

fn raw(store: &MemoryStore, shard_id: i64, object: i64) -> MessageId {
    store.insert_raw(&shard(shard_id), CategoryId(1), object, "{}")
}

fn options(worker: &str, lease: Duration) -> ClaimOptions {
    ClaimOptions {
        worker: worker.to_owned(),
        lease,
        mode: HandlerMode::Leased,
    }
}

fn ack_of(ids: &[MessageId], object: i64) -> Acknowledgement {
    Acknowledgement {
        group: GroupKey {
            category: CategoryId(1),
            object_identifier: object.into(),
        },
        ids: ids.to_vec(),
    }
}

#[tokio::test]
async fn discovery_pages_through_shards_in_key_order() {
    let store = MemoryStore::new();
    for id in [3, 1, 2, 5, 4] {
        raw(&store, id, 1);
    }
    let page = store.discover(None, 2).await.unwrap();
    assert_eq!(page.due, [shard(1), shard(2)]);
    assert_eq!(page.next, Some(shard(2)));
    let page = store.discover(Some(&shard(2)), 2).await.unwrap();
    assert_eq!(page.due, [shard(3), shard(4)]);
    let page = store.discover(Some(&shard(4)), 2).await.unwrap();
    assert_eq!((page.due, page.next), (vec![shard(5)], None));
}

#[tokio::test]
async fn claims_are_exclusive_with_rising_tokens_and_lapse_with_the_clock() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    raw(&store, 1, 1);
    let lease = Duration::from_secs(10);
    let first = store.claim(&shard(1), &options("a", lease)).await.unwrap();
    let first = first.expect("due");
    assert_eq!(
        (
            first.lease().attempts,
            first.lease().previous_owner.as_deref()
        ),
        (0, None)
    );
    assert!(
        store
            .claim(&shard(1), &options("b", lease))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store.discover(None, 10).await.unwrap().due.is_empty(),
        "a leased shard is not due"
    );

    clock.advance(lease);
    let second = store.claim(&shard(1), &options("b", lease)).await.unwrap();
    let mut second = second.expect("a lapsed lease is taken over");
    assert!(second.lease().token > first.lease().token);
    assert_eq!(
        second.lease().attempts,
        1,
        "the lapsed claim counts as an attempt"
    );
    assert_eq!(second.lease().previous_owner.as_deref(), Some("a"));

    let mut first = first;
    let rows = first.fetch(10).await.unwrap();
    let stale = first.ack(&[ack_of(&[rows[0].id], 1)]).await;
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    assert_eq!(
        store.pending_messages(10).await.unwrap().len(),
        1,
        "nothing deleted"
    );
    assert_eq!(second.ack(&[ack_of(&[rows[0].id], 1)]).await.unwrap(), 1);
    second.finish(Outcome::Drained).await.unwrap();
    assert!(
        store.shard_states().await.unwrap().is_empty(),
        "an emptied shard keeps no state"
    );
}

#[tokio::test]
async fn acknowledgements_delete_exactly_the_ids_given_in_the_shard() {
    let store = MemoryStore::new();
    let a = raw(&store, 1, 1);
    let other = raw(&store, 2, 1);
    let b = raw(&store, 1, 1);
    let mut session = store
        .claim(&shard(1), &options("w", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    let deleted = session.ack(&[ack_of(&[a, other], 1)]).await.unwrap();
    assert_eq!(
        deleted, 1,
        "a row of another shard is not this session's to delete"
    );
    let left: Vec<_> = store
        .pending_messages(10)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(left, [other, b]);
    session.finish(Outcome::Yielded).await.unwrap();
    let state = &store.shard_states().await.unwrap()[0];
    assert_eq!((state.lease_owner.as_deref(), state.attempts), (None, 0));
}

#[tokio::test]
async fn failures_back_off_until_retry_or_a_newer_message() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let head = raw(&store, 1, 1);
    let session = store
        .claim(&shard(1), &options("w", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    session
        .finish(Outcome::Failed(Failure {
            error: "boom".into(),
            attempts: 3,
            retry_in: Duration::from_secs(60),
            watermark: head,
            parked_category: Some(CategoryId(9)),
        }))
        .await
        .unwrap();
    let state = &store.shard_states().await.unwrap()[0];
    assert_eq!(
        (state.attempts, state.last_error.as_deref()),
        (3, Some("boom"))
    );
    assert_eq!(state.parked_category, Some(CategoryId(9)));
    assert!(store.discover(None, 10).await.unwrap().due.is_empty());

    // Parked (S26): neither its retry time nor a newer message makes it due; an unpark of
    // its category does.
    clock.advance(Duration::from_secs(3_600));
    raw(&store, 1, 3);
    assert!(store.discover(None, 10).await.unwrap().due.is_empty());
    assert_eq!(
        store.unpark(&[CategoryId(1)]).await.unwrap(),
        0,
        "parked on another category"
    );
    assert_eq!(store.unpark(&[CategoryId(9)]).await.unwrap(), 1);
    assert_eq!(
        store.discover(None, 10).await.unwrap().due,
        [shard(1)],
        "unparked"
    );
    assert_eq!(store.shard_states().await.unwrap()[0].parked_category, None);

    // A failure that is not a park backs off for its time.
    let session = store
        .claim(&shard(1), &options("w", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    let newest = store.newest_message_id().await.unwrap().unwrap();
    session
        .finish(Outcome::Failed(Failure {
            error: "boom".into(),
            attempts: 3,
            retry_in: Duration::from_secs(60),
            watermark: newest,
            parked_category: None,
        }))
        .await
        .unwrap();
    let state = &store.shard_states().await.unwrap()[0];
    assert_eq!(state.retry_at, Some(clock.now() + Duration::from_secs(60)));
    assert!(store.discover(None, 10).await.unwrap().due.is_empty());
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        store.discover(None, 10).await.unwrap().due,
        [shard(1)],
        "backoff ended"
    );

    // Back off again; a message newer than the watermark makes the shard due at once.
    let session = store
        .claim(&shard(1), &options("w", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(session.lease().attempts, 3, "a claim keeps the attempts");
    session
        .finish(Outcome::Failed(Failure {
            error: "boom".into(),
            attempts: 4,
            retry_in: Duration::from_secs(60),
            watermark: newest,
            parked_category: None,
        }))
        .await
        .unwrap();
    assert!(store.discover(None, 10).await.unwrap().due.is_empty());
    raw(&store, 1, 2);
    assert_eq!(store.discover(None, 10).await.unwrap().due, [shard(1)]);
    assert!(store.reschedule(&shard(1)).await.unwrap());
    assert!(
        !store.reschedule(&shard(1)).await.unwrap(),
        "no longer backing off"
    );
}

#[tokio::test]
async fn released_keeps_failures_and_release_makes_the_next_claim_a_takeover() {
    let store = MemoryStore::new();
    raw(&store, 1, 1);
    let lease = Duration::from_secs(30);
    let session = store
        .claim(&shard(1), &options("w", lease))
        .await
        .unwrap()
        .unwrap();
    session
        .finish(Outcome::Failed(Failure {
            error: "boom".into(),
            attempts: 2,
            retry_in: Duration::ZERO,
            watermark: MessageId(1),
            parked_category: None,
        }))
        .await
        .unwrap();
    let session = store
        .claim(&shard(1), &options("w", lease))
        .await
        .unwrap()
        .unwrap();
    session.finish(Outcome::Released).await.unwrap();
    let state = &store.shard_states().await.unwrap()[0];
    assert_eq!(
        (state.attempts, state.last_error.as_deref()),
        (2, Some("boom"))
    );

    let session = store
        .claim(&shard(1), &options("w", lease))
        .await
        .unwrap()
        .unwrap();
    let lease_held = session.lease().clone();
    assert!(store.extend_lease(&lease_held, lease).await.unwrap());
    assert!(store.release(&lease_held).await.unwrap());
    let again = store
        .claim(&shard(1), &options("v", lease))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.lease().attempts,
        3,
        "the interrupted drain counts as an attempt"
    );
    assert_eq!(again.lease().previous_owner.as_deref(), Some("w"));
    assert!(
        !store.release(&lease_held).await.unwrap(),
        "the old lease is not current"
    );
    assert!(matches!(
        session.finish(Outcome::Drained).await,
        Err(Error::LeaseLost { .. })
    ));
}

#[tokio::test]
async fn fetch_newest_finds_each_groups_tail_within_the_bounds() {
    let store = MemoryStore::new();
    let ids: Vec<_> = [1, 2, 1, 1, 2, 1]
        .iter()
        .map(|object| raw(&store, 1, *object))
        .collect();
    let mut session = store
        .claim(&shard(1), &options("w", Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    let groups = [1, 2].map(|object: i64| GroupKey {
        category: CategoryId(1),
        object_identifier: object.into(),
    });
    let mut tails = session.fetch_newest(&groups, ids[1], ids[4]).await.unwrap();
    tails.sort_by_key(|tail| tail.newest.object_identifier);
    assert_eq!(tails.len(), 2);
    assert_eq!(
        (tails[0].newest.id, tails[0].ids.clone()),
        (ids[3], vec![ids[2], ids[3]])
    );
    assert_eq!(
        (tails[1].newest.id, tails[1].ids.clone()),
        (ids[4], vec![ids[4]])
    );
    assert_eq!(store.pending_in_shard(&shard(1), ids[2]).await.unwrap(), 3);
    assert_eq!(store.newest_message_id().await.unwrap(), Some(ids[5]));
}

#[tokio::test]
async fn faults_fail_operations_as_a_lost_database_would() {
    let store = MemoryStore::new();
    raw(&store, 1, 1);
    store.fail_next(2);
    assert!(store.discover(None, 10).await.unwrap_err().is_unavailable());
    assert!(store.shard_states().await.unwrap_err().is_unavailable());
    assert!(
        store.discover(None, 10).await.is_ok(),
        "two operations failed, then none"
    );
    store.set_unavailable(true);
    assert!(store.check_schema().await.unwrap_err().is_unavailable());
    store.set_unavailable(false);
    assert!(store.check_schema().await.is_ok());
}

#[tokio::test]
async fn in_transaction_mode_is_refused_with_a_typed_error() {
    let store = MemoryStore::new();
    raw(&store, 1, 1);
    let mut options = options("w", Duration::from_secs(30));
    options.mode = HandlerMode::InTransaction;
    let error = store.claim(&shard(1), &options).await.unwrap_err();
    assert!(matches!(error, Error::Unsupported { .. }), "{error:?}");
    assert!(error.to_string().contains("InTransaction"), "{error}");
}

mod backfill {
    use super::*;
    use crate::backfill::{
        BackfillModel, BackfillOptions, BackfillOutcome, BackfillPhase, BackfillStart,
    };
    use crate::model::Category;
    use crate::test_models::Thing;

    fn walked(outcome: &BackfillOutcome) -> (usize, usize, bool) {
        match *outcome {
            BackfillOutcome::Walked {
                size,
                rows,
                complete,
                ..
            } => (size, rows, complete),
            ref other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// The in-memory store walks as the SQL backends do: gated, batches of the budget less the
    /// backlog in key order, completion, and nothing more after it.
    #[tokio::test]
    async fn walks_behind_the_backlog_to_completion() {
        let store = MemoryStore::new();
        let things: Vec<Thing> = [5, 1, 4, 2, 3].into_iter().map(|id| Thing { id }).collect();
        store.save(&things).expect("save");
        let model = BackfillModel::of::<Thing>();
        let options = |budget| BackfillOptions {
            worker: "memory".to_owned(),
            budget,
        };
        let gated = store.backfill(&model, &options(100)).await.expect("tick");
        assert_eq!(gated.outcome, BackfillOutcome::Gated);
        store
            .start_backfill(&BackfillStart::new(Thing::ID, 2))
            .await
            .expect("start");
        // Five pending from the saves: 7 less 5.
        let first = store.backfill(&model, &options(7)).await.expect("tick");
        assert_eq!(walked(&first.outcome), (2, 2, false));
        let state = first.state.expect("a state");
        assert_eq!(state.low_bound, Some(crate::Id::integer(2)));
        let objects: Vec<i64> = store
            .pending_messages(100)
            .await
            .expect("pending")
            .iter()
            .skip(5)
            .map(|row| row.object_identifier.as_integer().unwrap_or_default())
            .collect();
        assert_eq!(objects, [1, 2], "in key order, after the saves' own");
        let second = store.backfill(&model, &options(7)).await.expect("tick");
        assert_eq!(
            walked(&second.outcome),
            (1, 1, false),
            "never below one row"
        );
        let last = store.backfill(&model, &options(100)).await.expect("tick");
        assert_eq!(
            walked(&last.outcome),
            (92, 2, true),
            "100 less the 8 pending"
        );
        let done = store.backfills().await.expect("list").remove(0);
        assert_eq!((done.phase(), done.rows_walked), (BackfillPhase::Done, 5));
        let after = store.backfill(&model, &options(100)).await.expect("tick");
        assert_eq!(after.outcome, BackfillOutcome::Gated);
        assert!(!store.pause_backfill(Thing::ID).await.expect("pause"));
    }

    /// How many rows a running relay walks in the first 100 ms of a
    /// backfill of 2,000 rows (ticks every 10 ms, budget 160), paced or not, in paused time.
    async fn walked_in_100_ms(paced: bool) -> u64 {
        use crate::backfill::BackfillStart;
        use crate::memory::MemoryStore;
        use crate::model::Category;
        use crate::store::Admin;
        use crate::test_models::Thing;
        use crate::{Deletion, Registry, Relay, RelayConfig, Replication};

        let store = MemoryStore::new();
        let things: Vec<Thing> = (1..=2_000).map(|id| Thing { id }).collect();
        store.save(&things).expect("save");
        let registry = Registry::builder()
            .replication::<Thing>(|_: Replication<Thing>| async { Ok::<(), std::io::Error>(()) })
            .deletion::<Thing>(|_: Deletion<Thing>| async { Ok::<(), std::io::Error>(()) })
            .build()
            .expect("a registry");
        let config = RelayConfig::builder()
            .backfill_interval(Some(Duration::from_millis(10)))
            .backfill_budget(160)
            .backfill_paced(paced)
            .build()
            .expect("a configuration");
        let relay = Relay::with_config(store.clone(), registry, config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn({
            let relay = relay.clone();
            async move {
                relay
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
            }
        });
        // The saves' own outboxes delivered first: the walk then has no backlog to give way to.
        while !store.pending().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        store
            .start_backfill(&BackfillStart::new(Thing::ID, 2))
            .await
            .expect("start");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let walked = store.backfills().await.expect("backfills")[0].rows_walked;
        let _ = stop.send(());
        running
            .await
            .expect("the relay's task")
            .expect("the relay's run");
        walked
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_relay_starts_a_walk_at_a_sixteenth_of_its_budget_unless_told_not_to() {
        // Ten or eleven ticks: 10 rows each (160 / 16), where the first window (half a
        // second) has not closed yet.
        let paced = walked_in_100_ms(true).await;
        assert!((1..=110).contains(&paced), "paced: {paced} rows");
        let unpaced = walked_in_100_ms(false).await;
        assert!(unpaced >= 320, "the whole budget each tick: {unpaced} rows");
    }
}
