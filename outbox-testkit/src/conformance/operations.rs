//! What operators do to a running outbox: dead letters, pauses and the relay's
//! upkeep (retention, compaction of paused shards).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use outbox_core::admin::{Admin, DeadLetter, DeadLetterFilter, PauseTarget, ShardStatus};
use outbox_core::store::Store;
use outbox_core::store::{DeadLettering, ShardSession};
use outbox_core::{BoxError, Category, Delivery, Error, MessageId, Registry, Relay, Scope};

use super::{claim_options, config, int, pending, pending_ids, state_of, write};
use crate::backend::StoreBackend;
use crate::fixtures::{
    AuditEvent, Note, OrgAlert, OrgScope, OrgUpdate, ProjectUpdate, Recorder, UserScope,
    UserUpdate, note, org_shard,
};

/// A handler of `C` that records each delivery, and fails it while `failing` holds for the
/// delivery's (shard, object).
fn failing_while<C: Category<Payload = Note>>(
    recorder: &Recorder,
    failing: impl Fn(i64, i64) -> bool + Send + Sync + 'static,
) -> impl outbox_core::handler::Handler<Delivery<C>> + Clone {
    let (recorder, failing) = (recorder.clone(), Arc::new(failing));
    move |delivery: Delivery<C>| {
        recorder.record(&delivery);
        let fail = failing(
            int(delivery.shard.shard_identifier),
            int(delivery.object_identifier),
        );
        async move {
            if fail {
                return Err::<(), BoxError>("the downstream service refused it".into());
            }
            Ok(())
        }
    }
}

/// Every dead letter.
async fn dead_letters<S: Admin>(store: &S) -> Vec<DeadLetter> {
    store
        .dead_letters(&DeadLetterFilter::all())
        .await
        .expect("list dead letters")
}

/// The message ids of dead letters.
fn letter_ids(letters: &[DeadLetter]) -> Vec<MessageId> {
    letters.iter().map(|letter| letter.message_id).collect()
}

/// The (object, seq) of the deliveries a recorder saw in shard `shard` of the organization
/// scope.
fn delivered(recorder: &Recorder, shard: i64) -> Vec<(i64, u64)> {
    recorder
        .in_shard(&org_shard(shard))
        .into_iter()
        .map(|seen| (int(seen.object), seen.seq))
        .collect()
}

/// The seq of a pending message's note.
fn seq_of(payload: &str) -> u64 {
    serde_json::from_str::<Note>(payload)
        .expect("a note payload")
        .seq
}

/// The default dead-letter policy: a category without `max_attempts` blocks its shard on a failing group,
/// however often it fails; nothing is set aside.
pub async fn s22_failing_groups_block_their_shard_by_default<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgUpdate>(&recorder, |_, object| object == 1);
    let relay = Relay::with_config(
        store.clone(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("s22-default"),
    );
    let ids = write(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(1, 2, 2)],
    )
    .await;
    for attempt in 1..=4 {
        let report = relay.drain().await.expect("drain");
        assert_eq!(report.failures.len(), 1, "attempt {attempt} fails");
        assert!(report.dead_lettered.is_empty(), "nothing is set aside");
        assert!(store.reschedule(&org_shard(1)).await.expect("reschedule"));
    }
    let state = state_of(&store, &org_shard(1)).await.expect("a state");
    assert_eq!(state.attempts, 4);
    assert_eq!(pending_ids(&backend).await, ids, "the shard is blocked");
    assert!(dead_letters(&store).await.is_empty());
}

/// With `max_attempts = 2`, the failing group (all its rows read) moves to the dead
/// letters at its second failed attempt, with its error, attempts, failure times and fencing
/// token, and the shard goes on with the groups behind it, in order.
pub async fn s22_a_group_is_dead_lettered_after_max_attempts_and_its_shard_goes_on<
    B: StoreBackend,
>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgAlert>(&recorder, |shard, object| shard == 1 && object == 1);
    let relay = Relay::with_config(
        store.clone(),
        recorder.registry_with::<OrgAlert>(handler),
        config("s22"),
    );
    assert_eq!(OrgAlert::MAX_ATTEMPTS, Some(2));
    let ids = write(
        &backend,
        &[
            note::<OrgAlert>(1, 1, 1),
            note::<OrgAlert>(1, 2, 2),
            note::<OrgAlert>(1, 1, 3),
            note::<OrgAlert>(1, 3, 4),
            note::<OrgAlert>(2, 1, 5),
        ],
    )
    .await;

    let first = relay.drain().await.expect("drain");
    assert_eq!(first.failures.len(), 1, "the first attempt backs off");
    assert!(first.dead_lettered.is_empty());
    assert_eq!(delivered(&recorder, 2), [(1, 5)], "shard 2 is not held up");
    let between = SystemTime::now();
    assert!(store.reschedule(&org_shard(1)).await.expect("reschedule"));

    let second = relay.drain().await.expect("drain");
    assert!(second.failures.is_empty(), "{:?}", second.failures);
    assert_eq!(second.dead_lettered.len(), 1);
    let set_aside = &second.dead_lettered[0];
    assert_eq!(
        (set_aside.shard.clone(), set_aside.attempts, set_aside.rows),
        (org_shard(1), 2, 2)
    );
    assert_eq!(
        delivered(&recorder, 1),
        [(1, 3), (1, 3), (2, 2), (3, 4)],
        "the group behind the dead letters are delivered, in order"
    );
    assert!(pending(&backend).await.is_empty());
    assert!(
        state_of(&store, &org_shard(1))
            .await
            .is_none_or(|state| state.attempts == 0),
        "the shard is healthy again"
    );

    let letters = dead_letters(&store).await;
    assert_eq!(letter_ids(&letters), [ids[0], ids[2]], "the whole group");
    let slack = Duration::from_millis(50);
    for (letter, seq) in letters.iter().zip([1, 3]) {
        assert_eq!(letter.shard, org_shard(1));
        assert_eq!(letter.category, OrgAlert::ID);
        assert_eq!(int(letter.object_identifier), 1);
        assert_eq!(seq_of(&letter.payload), seq);
        assert_eq!(letter.attempts, 2);
        assert!(
            letter.error.contains("the downstream service refused it"),
            "{}",
            letter.error
        );
        assert!(letter.lease_token > 0);
        assert!(
            letter.first_failed_at <= between + slack,
            "the first failure is the first attempt's"
        );
        assert!(letter.dead_lettered_at + slack >= between);
        assert!(letter.first_failed_at <= letter.dead_lettered_at);
    }
    assert_eq!(letters[0].lease_token, letters[1].lease_token);
}

/// Dead letters are listed by category, scope, shard, age and limit; replayed as new
/// messages in the order of their original ids (then delivered, in order); a replay that
/// names one that is not (or no longer) a dead letter changes nothing; two replays of the
/// same letters at once replay them once; purged letters are gone.
pub async fn s22_dead_letters_are_listed_replayed_in_order_and_purged<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let failing = Arc::new(AtomicBool::new(true));
    let handler = {
        let failing = Arc::clone(&failing);
        failing_while::<OrgUpdate>(&recorder, move |_, _| failing.load(Ordering::SeqCst))
    };
    // The policy from the registry, over the category's (none).
    let registry: Registry = recorder
        .builder_with::<OrgUpdate>(handler)
        .max_attempts::<OrgUpdate>(1)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(store.clone(), registry, config("s22-replay"));
    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(2, 3, 3),
        ],
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        report.dead_lettered.len(),
        3,
        "each group at its first failure"
    );
    assert!(pending(&backend).await.is_empty());

    let listed = |filter: DeadLetterFilter| {
        let store = store.clone();
        async move {
            letter_ids(
                &store
                    .dead_letters(&filter)
                    .await
                    .expect("list dead letters"),
            )
        }
    };
    assert_eq!(listed(DeadLetterFilter::all()).await, ids);
    assert_eq!(
        listed(DeadLetterFilter::all().category(OrgUpdate::ID)).await,
        ids
    );
    assert!(
        listed(DeadLetterFilter::all().category(ProjectUpdate::ID))
            .await
            .is_empty()
    );
    assert_eq!(
        listed(DeadLetterFilter::all().scope(OrgScope::ID)).await,
        ids
    );
    assert!(
        listed(DeadLetterFilter::all().scope(UserScope::ID))
            .await
            .is_empty()
    );
    assert_eq!(
        listed(DeadLetterFilter::all().shard(org_shard(1))).await,
        ids[..2]
    );
    assert_eq!(listed(DeadLetterFilter::all().limit(1)).await, ids[..1]);
    assert_eq!(
        listed(DeadLetterFilter::all().ids([ids[2], ids[0]])).await,
        [ids[0], ids[2]]
    );
    assert!(listed(DeadLetterFilter::all().ids([])).await.is_empty());
    assert_eq!(
        listed(
            DeadLetterFilter::all()
                .shard(org_shard(1))
                .ids([ids[2], ids[1]])
        )
        .await,
        [ids[1]]
    );
    assert!(
        listed(DeadLetterFilter::all().older_than(Duration::from_secs(3600)))
            .await
            .is_empty()
    );
    assert_eq!(
        listed(DeadLetterFilter::all().older_than(Duration::ZERO)).await,
        ids
    );

    // Replayed in the order of their original ids, whatever the order asked.
    let replayed = store
        .replay_dead_letters(&[ids[1], ids[0]])
        .await
        .expect("replay");
    assert_eq!(replayed.len(), 2);
    assert!(replayed[0] < replayed[1] && replayed[0] > ids[2]);
    let rows = pending(&backend).await;
    assert_eq!(
        rows.iter()
            .map(|row| (row.id, int(row.object_identifier), seq_of(&row.payload)))
            .collect::<Vec<_>>(),
        [(replayed[0], 1, 1), (replayed[1], 2, 2)]
    );
    assert_eq!(listed(DeadLetterFilter::all()).await, ids[2..]);

    // Replayed already, or one of them is: nothing changes.
    let twice = [
        (vec![ids[0], ids[1]], vec![ids[0], ids[1]]),
        (vec![ids[2], ids[0]], vec![ids[0]]),
    ];
    for (again, gone) in twice {
        match store.replay_dead_letters(&again).await {
            Err(Error::NoSuchDeadLetter { ids: missing }) => assert_eq!(missing, gone),
            other => panic!("expected NoSuchDeadLetter, got {other:?}"),
        }
        assert_eq!(listed(DeadLetterFilter::all()).await, ids[2..]);
        assert_eq!(pending_ids(&backend).await, replayed);
    }

    // The replayed messages are delivered, in order.
    failing.store(false, Ordering::SeqCst);
    relay.drain().await.expect("drain");
    let seen = delivered(&recorder, 1);
    assert_eq!(&seen[seen.len() - 2..], [(1, 1), (2, 2)]);
    assert!(pending(&backend).await.is_empty());

    // Two replays of the same letter at once: one replays it, the other finds it gone.
    let other = backend.connect_store().await;
    let (one, two) = tokio::join!(
        store.replay_dead_letters(&ids[2..]),
        other.replay_dead_letters(&ids[2..])
    );
    let won = [&one, &two].iter().filter(|result| result.is_ok()).count();
    assert_eq!(won, 1, "exactly one replay wins: {one:?} / {two:?}");
    for result in [one, two] {
        if let Err(error) = result {
            assert!(matches!(error, Error::NoSuchDeadLetter { .. }), "{error:?}");
        }
    }
    assert_eq!(pending(&backend).await.len(), 1, "replayed once");
    relay.drain().await.expect("drain");
    assert_eq!(delivered(&recorder, 2).last(), Some(&(3, 3)));

    // Purged letters are gone.
    failing.store(true, Ordering::SeqCst);
    let more = write(&backend, &[note::<OrgUpdate>(3, 4, 4)]).await;
    relay.drain().await.expect("drain");
    assert_eq!(listed(DeadLetterFilter::all()).await, more);
    assert_eq!(store.purge_dead_letters(&more).await.expect("purge"), 1);
    assert!(dead_letters(&store).await.is_empty());
    assert_eq!(store.purge_dead_letters(&more).await.expect("purge"), 0);
}

/// A worker whose lease lapsed cannot set a group aside: nothing moves.
pub async fn s22_a_stale_worker_cannot_dead_letter<B: StoreBackend>() {
    let backend = B::create().await;
    let ids = write(&backend, &[note::<OrgAlert>(1, 1, 1)]).await;
    let shard = org_shard(1);
    let store = backend.store();
    let mut options = claim_options("stale");
    options.lease = Duration::from_millis(100);
    let mut stale = store
        .claim(&shard, &options)
        .await
        .expect("claim")
        .expect("due");
    let head = stale.fetch(10).await.expect("fetch");
    assert_eq!(head.len(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fresh = backend
        .connect_store()
        .await
        .claim(&shard, &claim_options("fresh"))
        .await
        .expect("claim")
        .expect("the lapsed lease is taken over");

    let letter = DeadLettering {
        rows: outbox_core::store::Acknowledgement {
            group: outbox_core::store::GroupKey {
                category: OrgAlert::ID,
                object_identifier: head[0].object_identifier,
            },
            ids: ids.clone(),
        },
        error: "stale".into(),
        attempts: 2,
    };
    match stale.dead_letter(&letter).await {
        Err(Error::LeaseLost { token, .. }) => assert_eq!(token, stale.lease().token),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(pending_ids(&backend).await, ids, "nothing moved");
    assert!(dead_letters(&store).await.is_empty());
    drop(fresh);
}

/// Retention: the relay's upkeep purges the dead letters older than the configured age, and
/// none without one.
pub async fn dead_letter_retention_purges_old_letters<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgUpdate>(&recorder, |_, _| true);
    let registry = || {
        recorder
            .builder_with::<OrgUpdate>(handler.clone())
            .max_attempts::<OrgUpdate>(1)
            .build()
            .expect("a registry")
    };
    let relay_keeping = |retention: Option<Duration>| {
        let config = config("retention")
            .to_builder()
            .dead_letter_retention(retention)
            .build()
            .expect("a valid relay configuration");
        Relay::with_config(store.clone(), registry(), config)
    };
    write(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(2, 2, 2)],
    )
    .await;
    relay_keeping(None).drain().await.expect("drain");
    assert_eq!(dead_letters(&store).await.len(), 2);

    for kept in [None, Some(Duration::from_secs(3600))] {
        let report = relay_keeping(kept).maintain().await.expect("upkeep");
        assert_eq!(report.purged_dead_letters, 0, "{kept:?}");
        assert_eq!(dead_letters(&store).await.len(), 2);
    }
    let report = relay_keeping(Some(Duration::ZERO))
        .maintain()
        .await
        .expect("upkeep");
    assert_eq!(report.purged_dead_letters, 2);
    assert!(dead_letters(&store).await.is_empty());
}

/// A paused shard delivers nothing while others carry on; its coalescing groups shed
/// the rows between their oldest and newest (the newest carries the payload, the oldest the
/// group's place), event categories keep every row; resuming delivers each group once, in
/// order.
pub async fn s23_a_paused_shard_delivers_nothing_then_resumes_once_per_group<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let relay = Relay::with_config(store.clone(), recorder.registry(), config("s23"));
    let paused = PauseTarget::Shard(org_shard(1));
    assert!(
        store
            .pause(&paused, Some("downstream maintenance"))
            .await
            .expect("pause")
    );
    assert!(
        !store.pause(&paused, Some("again")).await.expect("pause"),
        "paused already"
    );
    let pauses = store.pauses().await.expect("pauses");
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].target, paused);
    assert_eq!(pauses[0].reason.as_deref(), Some("downstream maintenance"));

    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<ProjectUpdate>(1, 1, 2),
            note::<OrgUpdate>(1, 1, 3),
            note::<AuditEvent>(1, 9, 4),
            note::<OrgUpdate>(1, 1, 5),
            note::<AuditEvent>(1, 9, 6),
            note::<OrgUpdate>(1, 1, 7),
            note::<AuditEvent>(1, 9, 8),
            note::<OrgUpdate>(2, 1, 9),
        ],
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.shards_claimed, 1, "only shard 2");
    assert!(
        delivered(&recorder, 1).is_empty(),
        "the paused shard delivers nothing"
    );
    assert_eq!(delivered(&recorder, 2), [(1, 9)]);

    let upkeep = relay.maintain().await.expect("upkeep");
    assert_eq!(
        upkeep.compacted, 2,
        "the OrgUpdate rows between its oldest and newest"
    );
    assert_eq!(
        pending_ids(&backend).await,
        [ids[0], ids[1], ids[3], ids[5], ids[6], ids[7]]
    );
    assert_eq!(relay.maintain().await.expect("upkeep").compacted, 0);
    relay.drain().await.expect("drain");
    assert!(delivered(&recorder, 1).is_empty());

    assert!(store.resume(&paused).await.expect("resume"));
    assert!(
        !store.resume(&paused).await.expect("resume"),
        "resumed already"
    );
    assert!(store.pauses().await.expect("pauses").is_empty());
    relay.drain().await.expect("drain");
    assert_eq!(
        recorder
            .in_shard(&org_shard(1))
            .iter()
            .map(|seen| (seen.category, seen.seq))
            .collect::<Vec<_>>(),
        [
            ("org_update", 7),
            ("project_update", 2),
            ("audit_event", 4),
            ("audit_event", 6),
            ("audit_event", 8),
        ],
        "each group once, in order, with its newest payload; every event"
    );
    assert!(pending(&backend).await.is_empty());
}

/// A scope's pause holds all its shards and no other scope's; a category's pause holds
/// every shard with a message of it (all of that shard: its order is kept) and no other.
pub async fn s23_scope_and_category_pauses_hold_their_shards<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let relay = Relay::with_config(store.clone(), recorder.registry(), config("s23-kinds"));
    let user_shard = crate::fixtures::user_shard(1);
    let shards_seen = |recorder: &Recorder| {
        let mut shards: Vec<_> = recorder.seen().into_iter().map(|seen| seen.shard).collect();
        shards.sort();
        shards.dedup();
        shards
    };

    let scope = PauseTarget::Scope(OrgScope::ID);
    store.pause(&scope, None).await.expect("pause");
    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<ProjectUpdate>(2, 1, 2),
            note::<UserUpdate>(1, 1, 3),
        ],
    )
    .await;
    relay.drain().await.expect("drain");
    assert_eq!(shards_seen(&recorder), std::slice::from_ref(&user_shard));
    store.resume(&scope).await.expect("resume");
    relay.drain().await.expect("drain");
    assert_eq!(
        shards_seen(&recorder),
        [org_shard(1), org_shard(2), user_shard.clone()]
    );

    let category = PauseTarget::Category(ProjectUpdate::ID);
    store
        .pause(&category, Some("bad deploy"))
        .await
        .expect("pause");
    let before = recorder.seen().len();
    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 4),
            note::<OrgUpdate>(2, 1, 5),
            note::<ProjectUpdate>(2, 1, 6),
        ],
    )
    .await;
    relay.drain().await.expect("drain");
    let after: Vec<_> = recorder.seen()[before..]
        .iter()
        .map(|seen| (seen.shard.clone(), seen.seq))
        .collect();
    assert_eq!(after, [(org_shard(1), 4)], "shard 2 holds a ProjectUpdate");
    store.resume(&category).await.expect("resume");
    relay.drain().await.expect("drain");
    let after: Vec<_> = recorder.seen()[before + 1..]
        .iter()
        .map(|seen| (seen.shard.clone(), seen.seq))
        .collect();
    assert_eq!(after, [(org_shard(2), 5), (org_shard(2), 6)]);
    assert!(pending(&backend).await.is_empty());
}

/// What operators read: the status counts each kind of shard (due, backing off, parked,
/// paused) and the dead letters, names the deepest shards; shards are listed by kind with
/// their state; a shard's messages in order.
pub async fn operators_see_status_shards_and_messages<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgUpdate>(&recorder, |shard, _| shard == 1);
    let failing_projects = failing_while::<ProjectUpdate>(&recorder, |_, _| true);
    let registry = Registry::builder()
        .handle::<OrgUpdate>(handler)
        .handle::<ProjectUpdate>(failing_projects)
        .max_attempts::<ProjectUpdate>(1)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(store.clone(), registry, config("operators"));
    store
        .pause(&PauseTarget::Shard(org_shard(2)), None)
        .await
        .expect("pause");
    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(2, 1, 3),
            note::<OrgUpdate>(2, 2, 4),
            note::<OrgUpdate>(2, 3, 5),
            note::<crate::fixtures::FutureCategory>(3, 1, 6),
            note::<ProjectUpdate>(5, 1, 7),
        ],
    )
    .await;
    relay.drain().await.expect("drain");
    write(&backend, &[note::<OrgUpdate>(4, 1, 8)]).await;

    let status = store.status(2).await.expect("status");
    assert_eq!(
        (
            status.shards,
            status.pending_messages,
            status.shards_due,
            status.shards_in_flight,
            status.shards_in_backoff,
            status.shards_parked,
            status.shards_paused,
            status.dead_letters,
        ),
        (4, 7, 1, 0, 1, 1, 1, 1),
        "{status:?}"
    );
    assert!(status.oldest_pending_at.is_some() && status.oldest_dead_letter_at.is_some());
    let deepest: Vec<_> = status
        .deepest
        .iter()
        .map(|info| (info.shard.clone(), info.pending))
        .collect();
    assert_eq!(deepest, [(org_shard(2), 3), (org_shard(1), 2)]);

    let listed = |query: ShardQuery| {
        let store = store.clone();
        async move {
            let list = store.shards(&query).await.expect("list shards");
            assert_eq!(list.sampled, None, "a small backlog is ranked whole");
            list.shards
                .into_iter()
                .map(|info| (info.shard.scope, int(info.shard.shard_identifier)))
                .collect::<Vec<_>>()
        }
    };
    use outbox_core::admin::{ShardFilter, ShardQuery};
    let all = |filter| ShardQuery::new(filter, 10);
    let org = |shards: &[i64]| {
        shards
            .iter()
            .map(|shard| (OrgScope::ID, *shard))
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(all(ShardFilter::Pending)).await, org(&[2, 1, 3, 4]));
    assert_eq!(listed(all(ShardFilter::Failing)).await, org(&[1, 3]));
    assert_eq!(listed(all(ShardFilter::Paused)).await, org(&[2]));
    assert_eq!(listed(all(ShardFilter::Parked)).await, org(&[3]));
    // By scope and by category, with every filter.
    assert_eq!(
        listed(all(ShardFilter::Pending).scope(UserScope::ID)).await,
        [],
        "no user shard has pending messages"
    );
    assert_eq!(
        listed(all(ShardFilter::Pending).scope(OrgScope::ID)).await,
        org(&[2, 1, 3, 4])
    );
    assert_eq!(
        listed(all(ShardFilter::Pending).category(crate::fixtures::FutureCategory::ID)).await,
        org(&[3])
    );
    assert_eq!(
        listed(all(ShardFilter::Pending).category(OrgUpdate::ID)).await,
        org(&[2, 1, 4])
    );
    assert_eq!(
        listed(all(ShardFilter::Failing).category(OrgUpdate::ID)).await,
        org(&[1])
    );
    assert_eq!(
        listed(all(ShardFilter::Failing).scope(UserScope::ID)).await,
        []
    );
    assert_eq!(
        listed(all(ShardFilter::Paused).category(OrgUpdate::ID)).await,
        org(&[2])
    );
    assert_eq!(
        listed(all(ShardFilter::Parked).scope(OrgScope::ID)).await,
        org(&[3])
    );
    assert_eq!(
        listed(all(ShardFilter::Parked).category(OrgUpdate::ID)).await,
        []
    );
    let failing = store
        .shards(&ShardQuery::new(ShardFilter::Failing, 1))
        .await
        .expect("list shards")
        .shards;
    let [shard] = failing.as_slice() else {
        panic!("one shard: {failing:?}")
    };
    assert_eq!((shard.attempts, shard.pending, shard.paused), (1, 2, false));
    assert!(
        shard
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("refused")),
        "{shard:?}"
    );
    assert!(shard.retry_at.is_some() && shard.lease_owner.is_none());
    let parked = store
        .shards(&all(ShardFilter::Parked))
        .await
        .expect("list shards")
        .shards;
    assert_eq!(
        parked[0].parked_category,
        Some(crate::fixtures::FutureCategory::ID)
    );

    let messages = store
        .shard_messages(&org_shard(2), 2)
        .await
        .expect("a shard's messages");
    assert_eq!(
        messages
            .iter()
            .map(|message| message.id)
            .collect::<Vec<_>>(),
        ids[2..4]
    );
    one_truth(&store, 10).await;

    // A new message in the backing-off shard makes it due at once (S19): the counts, the
    // deepest shards, the listings and the shard itself all say so.
    write(&backend, &[note::<OrgUpdate>(1, 3, 9)]).await;
    let status = one_truth(&store, 10).await;
    assert_eq!(
        (status.shards_due, status.shards_in_backoff),
        (2, 0),
        "{status:?}"
    );
    let shard = store
        .shard(&org_shard(1))
        .await
        .expect("a shard")
        .expect("shard 1 has pending messages");
    assert_eq!((shard.status, shard.attempts), (ShardStatus::Due, 1));
    let failing = store
        .shards(&all(ShardFilter::Failing))
        .await
        .expect("list shards")
        .shards;
    assert!(
        failing
            .iter()
            .any(|info| info.shard == org_shard(1) && info.status == ShardStatus::Due),
        "{failing:?}"
    );
    assert_eq!(
        store.shard(&org_shard(9)).await.expect("a shard"),
        None,
        "a shard without pending messages"
    );
    for (shard, status) in [
        (org_shard(2), ShardStatus::Paused),
        (org_shard(3), ShardStatus::Parked),
        (org_shard(4), ShardStatus::Due),
    ] {
        let info = store
            .shard(&shard)
            .await
            .expect("a shard")
            .expect("pending");
        assert_eq!(info.status, status, "{info:?}");
    }
}

/// The status's counts partition the shards by [`ShardStatus`], and agree with the statuses
/// of its deepest shards (all of them, when `deepest` exceeds their number) and of
/// [`Admin::shards`]'s listing.
async fn one_truth<S: Admin>(store: &S, deepest: usize) -> outbox_core::admin::OutboxStatus {
    let status = store.status(deepest).await.expect("status");
    let counts = [
        (ShardStatus::Due, status.shards_due),
        (ShardStatus::InFlight, status.shards_in_flight),
        (ShardStatus::BackingOff, status.shards_in_backoff),
        (ShardStatus::Parked, status.shards_parked),
        (ShardStatus::Paused, status.shards_paused),
    ];
    assert_eq!(
        counts.iter().map(|(_, n)| n).sum::<u64>(),
        status.shards,
        "each shard is counted once: {status:?}"
    );
    assert_eq!(status.deepest.len() as u64, status.shards, "{status:?}");
    let listed = store
        .shards(&outbox_core::admin::ShardQuery::new(
            outbox_core::admin::ShardFilter::Pending,
            deepest,
        ))
        .await
        .expect("list shards")
        .shards;
    for (kind, n) in counts {
        let shown = status
            .deepest
            .iter()
            .filter(|info| info.status == kind)
            .count();
        assert_eq!(
            shown as u64, n,
            "{kind} counted {n}, shown {shown}: {status:?}"
        );
        let listed = listed.iter().filter(|info| info.status == kind).count();
        assert_eq!(listed as u64, n, "{kind} counted {n}, listed {listed}");
    }
    status
}

/// A flush does not wait for a paused shard (a pause can last, and writers must
/// not stall): it delivers the other shards and names the paused one's rows at once, as paused,
/// and they are delivered once it is resumed.
pub async fn s23_a_flush_does_not_wait_for_a_paused_shard<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let config = config("s23-flush")
        .to_builder()
        .flush_wait(Duration::from_secs(60))
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(store.clone(), recorder.registry(), config);
    let paused = PauseTarget::Scope(OrgScope::ID);
    store.pause(&paused, None).await.expect("pause");
    let written = super::flush::committed(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<UserUpdate>(1, 1, 2)],
    )
    .await;

    let error = relay.flush(&written).await.expect_err("shard 1 is paused");
    let outbox_core::relay::FlushError::Incomplete { remaining, report } = &error else {
        panic!("expected an incomplete flush, got {error:?}");
    };
    assert_eq!(report.deliveries, 1, "the user shard is delivered");
    let [left] = remaining.as_slice() else {
        panic!("one shard left: {remaining:?}");
    };
    assert_eq!(
        (left.shard.clone(), left.messages, left.paused),
        (org_shard(1), 1, true)
    );
    assert!(
        left.waited < Duration::from_secs(60),
        "not waited for: {:?}",
        left.waited
    );
    assert!(error.to_string().contains("which is paused"), "{error}");

    store.resume(&paused).await.expect("resume");
    relay.flush(&written).await.expect("delivered once resumed");
    assert_eq!(delivered(&recorder, 1), [(1, 1)]);
}

/// `Relay::health` on a real store: the database answers; the lag counts the oldest message
/// of a due shard, not those of a shard backing off or paused; a relay that does not run is
/// not live.
pub async fn health_lag_counts_due_shards_only<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgUpdate>(&recorder, |shard, _| shard == 1);
    let relay = Relay::with_config(
        store.clone(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("health"),
    );
    let idle = relay.health().await;
    assert!(idle.database_reachable && !idle.is_live(), "{idle:?}");
    assert_eq!(idle.oldest_due_lag, None, "nothing pending");

    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    assert!(relay.health().await.oldest_due_lag.is_some(), "due");
    relay.drain().await.expect("drain");
    let failed = relay.health().await;
    assert_eq!(failed.oldest_due_lag, None, "shard 1 backs off: {failed:?}");
    assert!(failed.last_claim_at.is_some() && failed.last_ack_at.is_none());

    store
        .pause(&PauseTarget::Shard(org_shard(2)), None)
        .await
        .expect("pause");
    write(&backend, &[note::<OrgUpdate>(2, 1, 2)]).await;
    assert_eq!(
        relay.health().await.oldest_due_lag,
        None,
        "shard 2 is paused"
    );
    write(&backend, &[note::<OrgUpdate>(3, 1, 3)]).await;
    let lag = relay.health().await.oldest_due_lag.expect("shard 3 is due");
    assert!(lag < Duration::from_secs(60), "{lag:?}");
    relay.drain().await.expect("drain");
    let drained = relay.health().await;
    assert_eq!(drained.oldest_due_lag, None);
    assert!(drained.last_ack_at.is_some());
}

/// An operator sets aside the message that blocks its shard (its category has no
/// dead-letter policy, and it fails every time): the shard goes on at once, the letter carries
/// the reason and the attempts, and it replays like any other. A message whose shard a relay
/// holds is refused, as is one that is not pending, and nothing changes then.
pub async fn s25_an_operator_sets_one_message_aside<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let handler = failing_while::<OrgUpdate>(&recorder, |shard, object| shard == 1 && object == 1);
    let registry = Registry::builder()
        .handle::<OrgUpdate>(handler)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(store.clone(), registry, config("set-aside"));
    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(2, 1, 3),
        ],
    )
    .await;
    relay.drain().await.expect("drain");
    assert_eq!(pending_ids(&backend).await, ids[..2], "shard 1 is blocked");
    let blocked = state_of(&store, &org_shard(1))
        .await
        .expect("shard 1's state");
    assert_eq!(blocked.attempts, 1);

    let missing = MessageId(ids[2].0 + 1_000);
    match store.set_aside(missing, "gone").await {
        Err(Error::NoSuchMessage { id }) => assert_eq!(id, missing),
        other => panic!("expected NoSuchMessage, got {other:?}"),
    }
    match store.set_aside(ids[2], "delivered").await {
        Err(Error::NoSuchMessage { id }) => assert_eq!(id, ids[2]),
        other => panic!("a delivered message is not pending: {other:?}"),
    }

    // A relay holds the shard: refused, nothing changes.
    assert!(store.reschedule(&org_shard(1)).await.expect("reschedule"));
    let session = store
        .claim(&org_shard(1), &claim_options("holder"))
        .await
        .expect("claim")
        .expect("shard 1 is due");
    match store.set_aside(ids[0], "bad payload").await {
        Err(Error::ShardHeld { shard, owner }) => {
            assert_eq!(shard, org_shard(1));
            assert_eq!(owner.as_deref(), Some("holder"));
        }
        other => panic!("expected ShardHeld, got {other:?}"),
    }
    assert_eq!(pending_ids(&backend).await, ids[..2]);
    assert!(dead_letters(&store).await.is_empty());
    // It lets go (its lease lapses now), keeping the shard's failures.
    assert!(store.release(session.lease()).await.expect("release"));
    drop(session);

    // Set aside: the letter, and the shard goes on at once.
    let letter = store
        .set_aside(ids[0], "bad payload, ticket 7")
        .await
        .expect("set aside");
    assert_eq!(
        (
            letter.message_id,
            &letter.shard,
            letter.error.as_str(),
            letter.attempts
        ),
        (ids[0], &org_shard(1), "bad payload, ticket 7", 1)
    );
    assert_eq!(dead_letters(&store).await, std::slice::from_ref(&letter));
    let cleared = state_of(&store, &org_shard(1))
        .await
        .expect("shard 1's state");
    assert_eq!(
        (cleared.attempts, cleared.retry_at),
        (0, None),
        "{cleared:?}"
    );
    relay.drain().await.expect("drain");
    assert!(pending_ids(&backend).await.is_empty(), "the shard went on");
    assert!(
        recorder
            .seen()
            .iter()
            .any(|seen| seen.shard == org_shard(1) && seen.seq == 2),
        "the message after it was delivered"
    );

    // Replayed like any letter: it fails again, and blocks again.
    let replayed = store.replay_dead_letters(&[ids[0]]).await.expect("replay");
    relay.drain().await.expect("drain");
    assert_eq!(pending_ids(&backend).await, replayed);
}
