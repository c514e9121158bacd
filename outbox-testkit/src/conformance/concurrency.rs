//! Exclusive processing, leases and crashes.

use std::collections::{BTreeMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::handler::{Handler, HandlerContext};
use outbox_core::store::Store;
use outbox_core::store::{
    Acknowledgement, ClaimOptions, GroupKey, HandlerMode, Outcome, ShardSession,
};
use outbox_core::{BoxError, Delivery, MessageId, Relay, ShardKey};
use tokio::sync::{Barrier, Notify, watch};

use super::{
    claim_options, config, eventually, eventually_async, int, pending, pending_ids, write,
};
use crate::backend::{StoreBackend, TestBackend};
use crate::fixtures::{AuditEvent, OrgUpdate, Recorder, note, org_shard};
use crate::telemetry::capture;

/// Many workers claiming one shard at the same instant, each with connections of its
/// own: exactly one gets it, and the next claim carries a greater fencing token.
pub async fn s15_concurrent_claims_grant_one_lease<B: StoreBackend>() {
    let backend = B::create().await;
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let shard = org_shard(1);

    let contenders = 8;
    let barrier = Arc::new(Barrier::new(contenders));
    let mut tasks = Vec::new();
    for worker in 0..contenders {
        let store = backend.connect_store().await;
        let (barrier, shard) = (Arc::clone(&barrier), shard.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .claim(&shard, &claim_options(&format!("worker-{worker}")))
                .await
                .expect("claiming does not fail")
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let Some(session) = task.await.expect("claim task") {
            winners.push(session);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one worker holds the shard");
    let first = winners.pop().expect("one winner");
    let first_token = first.lease().token;
    first.finish(Outcome::Yielded).await.expect("release");

    let again = backend
        .store()
        .claim(&shard, &claim_options("later"))
        .await
        .expect("claim")
        .expect("a released shard can be claimed");
    assert!(again.lease().token > first_token, "fencing tokens increase");
}

/// Two relays with connections of their own drain 150 shards at once: no shard is ever
/// processed by both at the same time, both do work, and every group arrives, in order.
///
/// A relay claims in batches, so one that starts first could hold every shard before the other
/// claims at all. Each relay's handlers therefore wait, once, until the other relay has entered a
/// handler too: the first relay holds only what it claims before it has measured its pace (one
/// shard per handler slot), and the second finds the rest.
pub async fn s15_two_relays_share_shards_without_overlap<B: StoreBackend>() {
    let backend = B::create().await;
    let shards: i64 = 150;
    let mut messages = Vec::new();
    let mut seq = 0;
    for round in 0..2 {
        for shard in 1..=shards {
            seq += 1;
            messages.push(note::<OrgUpdate>(shard, 1, seq));
            seq += 1;
            messages.push(note::<AuditEvent>(shard, 2 + round, seq));
        }
    }
    backend.write(&messages).await.expect("write");

    let in_flight: Arc<Mutex<HashSet<ShardKey>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let entered_a = Arc::new(watch::Sender::new(false));
    let entered_b = Arc::new(watch::Sender::new(false));
    let exclusive = |recorder: &Recorder,
                     mine: &Arc<watch::Sender<bool>>,
                     other: &Arc<watch::Sender<bool>>| {
        let (recorder, in_flight, overlaps, mine, other) = (
            recorder.clone(),
            Arc::clone(&in_flight),
            Arc::clone(&overlaps),
            Arc::clone(mine),
            Arc::clone(other),
        );
        move |delivery: Delivery<OrgUpdate>| {
            let (recorder, in_flight, overlaps, mine, mut other) = (
                recorder.clone(),
                Arc::clone(&in_flight),
                Arc::clone(&overlaps),
                Arc::clone(&mine),
                other.subscribe(),
            );
            async move {
                mine.send_replace(true);
                // Bounded so that a relay that never works fails the assertion below instead
                // of hanging the suite.
                let _ =
                    tokio::time::timeout(Duration::from_secs(30), other.wait_for(|in_| *in_)).await;
                let entered = in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(delivery.shard.clone());
                if !entered {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                recorder.record(&delivery);
                in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&delivery.shard);
                Ok::<_, BoxError>(())
            }
        }
    };
    // One recorder for both relays: a shard is never in two handlers at once, so the order in
    // which its deliveries are recorded is the order in which they happened.
    let seen = Recorder::new();
    let relay_a = Relay::with_config(
        backend.connect_store().await,
        seen.registry_with::<OrgUpdate>(exclusive(&seen, &entered_a, &entered_b)),
        config("relay-a"),
    );
    let relay_b = Relay::with_config(
        backend.connect_store().await,
        seen.registry_with::<OrgUpdate>(exclusive(&seen, &entered_b, &entered_a)),
        config("relay-b"),
    );
    let (a, b) = tokio::join!(
        tokio::spawn(async move { relay_a.drain().await }),
        tokio::spawn(async move { relay_b.drain().await }),
    );
    let (a, b) = (
        a.expect("relay a").expect("drain a"),
        b.expect("relay b").expect("drain b"),
    );

    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a shard was processed by two workers at once"
    );
    assert!(
        a.shards_claimed > 0 && b.shards_claimed > 0,
        "both relays worked: {a:?} {b:?}"
    );
    assert!(a.is_clean() && b.is_clean());
    let mut by_shard: BTreeMap<i64, Vec<(&str, i64, u64)>> = BTreeMap::new();
    for seen in seen.seen() {
        by_shard
            .entry(int(seen.shard.shard_identifier))
            .or_default()
            .push((seen.category, int(seen.object), seen.seq));
    }
    assert_eq!(
        by_shard.len(),
        usize::try_from(shards).expect("small"),
        "every shard was drained"
    );
    let per_round = u64::try_from(shards).expect("small") * 2;
    for (shard, seen) in &by_shard {
        let first = u64::try_from(*shard).expect("positive") * 2 - 1;
        assert_eq!(
            seen,
            &[
                ("org_update", 1, first + per_round),
                ("audit_event", 2, first + 1),
                ("audit_event", 3, first + per_round + 1),
            ],
            "shard {shard}: groups in order of their oldest row, each once, newest payload"
        );
    }
    assert!(pending(&backend).await.is_empty());
}

/// Handlers run outside the claiming transaction under a lease; once the lease lapses
/// and another worker claims the shard, the stale worker's acknowledgement is refused and
/// deletes nothing. The stale worker here is one whose heartbeat cannot run: its handler
/// blocks its task (as a paused process would).
pub async fn s16_stale_worker_cannot_acknowledge<B: StoreBackend>() {
    let backend = B::create().await;
    let ids = write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let shard = org_shard(1);

    let stale = Recorder::new();
    let entered = Arc::new(Notify::new());
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let handler = {
        let (stale, entered) = (stale.clone(), Arc::clone(&entered));
        move |delivery: Delivery<OrgUpdate>| {
            stale.record(&delivery);
            entered.notify_one();
            // Blocks this task, and with it the heartbeat beside the handler (the runtime's
            // other tasks move to other threads).
            tokio::task::block_in_place(|| {
                let _ = released
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .recv();
            });
            async { Ok::<(), BoxError>(()) }
        }
    };
    let stale_config = config("stale")
        .to_builder()
        .lease(Duration::from_millis(400))
        .build()
        .expect("a valid relay configuration");
    let stale_relay = Relay::with_config(
        backend.store(),
        stale.registry_with::<OrgUpdate>(handler),
        stale_config,
    );
    let stale_run = tokio::spawn(async move { stale_relay.drain().await });
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the stale worker's handler started");
    tokio::time::sleep(Duration::from_millis(700)).await;

    let fresh_store = backend.connect_store().await;
    let mut fresh = fresh_store
        .claim(&shard, &claim_options("fresh"))
        .await
        .expect("claim")
        .expect("a lapsed lease can be taken over");
    let stale_token = stale.seen()[0].token;
    assert!(
        fresh.lease().token > stale_token,
        "the new owner's token is greater"
    );

    release.send(()).expect("release the stale handler");
    let report = stale_run.await.expect("stale task").expect("stale drain");
    assert_eq!(
        report.lost_leases,
        std::slice::from_ref(&shard),
        "the stale worker learns it lost the lease"
    );
    assert_eq!(
        report.rows_acknowledged, 0,
        "the stale acknowledgement deleted nothing"
    );
    assert_eq!(pending(&backend).await.len(), 1);

    let rows = fresh.fetch(10).await.expect("fetch");
    assert_eq!(rows.iter().map(|row| row.id).collect::<Vec<_>>(), ids);
    assert_eq!(
        fresh
            .ack(&[Acknowledgement {
                group: GroupKey {
                    category: rows[0].category,
                    object_identifier: rows[0].object_identifier,
                },
                ids: vec![rows[0].id],
            }])
            .await
            .expect("the owner acknowledges"),
        1
    );
    fresh.finish(Outcome::Drained).await.expect("finish");
    assert!(pending(&backend).await.is_empty());
}

/// The acknowledgement of one claimed shard's head, read whole.
async fn head_acknowledgement<S: ShardSession>(session: &mut S) -> Vec<Acknowledgement> {
    session
        .fetch(10)
        .await
        .expect("fetch")
        .iter()
        .map(|row| Acknowledgement {
            group: GroupKey {
                category: row.category,
                object_identifier: row.object_identifier,
            },
            ids: vec![row.id],
        })
        .collect()
}

/// Drained shards finished together (`Store::ack_and_finish_many`) are each fenced by their
/// own lease: the one whose lease another worker took over acknowledges nothing and learns
/// it lost the lease; the others' rows go and their shards are released.
pub async fn drained_shards_finished_together_are_each_fenced_by_their_lease<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let (ids, [mut first, mut stale, mut third], mut taker) =
        three_shards_the_second_taken_over(&backend, claim_options("batch")).await;
    let acks = [
        head_acknowledgement(&mut first).await,
        head_acknowledgement(&mut stale).await,
        head_acknowledgement(&mut third).await,
    ];
    let results = store
        .ack_and_finish_many(vec![
            (first, acks[0].clone()),
            (stale, acks[1].clone()),
            (third, acks[2].clone()),
        ])
        .await;
    assert_eq!(results.len(), 3);
    assert!(matches!(results[0], Ok((1, true))), "{:?}", results[0]);
    assert!(
        matches!(results[1], Err(outbox_core::Error::LeaseLost { .. })),
        "{:?}",
        results[1]
    );
    assert!(matches!(results[2], Ok((1, true))), "{:?}", results[2]);
    assert_eq!(
        pending_ids(&backend).await,
        [ids[1]],
        "only shard 2's message"
    );

    // The worker that took shard 2 over still holds it.
    let acks = head_acknowledgement(&mut taker).await;
    assert_eq!(
        taker.ack(&acks).await.expect("the new owner acknowledges"),
        1
    );
    taker.finish(Outcome::Drained).await.expect("finish");
    assert!(pending_ids(&backend).await.is_empty());
    let states = outbox_core::admin::Admin::shard_states(&store)
        .await
        .expect("shard states");
    assert!(states.is_empty(), "every shard released: {states:?}");
}

/// Leases extended together (a relay's heartbeats of one moment) are each fenced by their
/// own token: a lease another worker took over is not extended and says so, and the others
/// are, by the whole duration from now.
pub async fn leases_extended_together_are_each_fenced_by_their_token<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let short = ClaimOptions {
        lease: Duration::from_secs(5),
        ..claim_options("batch")
    };
    let (_, [first, stale, third], taker) =
        three_shards_the_second_taken_over(&backend, short).await;
    let leases = [
        first.lease().clone(),
        stale.lease().clone(),
        third.lease().clone(),
    ];
    let asked = std::time::SystemTime::now();
    let held = store
        .extend_leases(&leases, Duration::from_secs(600))
        .await
        .expect("extend the leases");
    assert_eq!(held, [true, false, true]);
    let states = outbox_core::admin::Admin::shard_states(&store)
        .await
        .expect("shard states");
    let state = |shard: u64| {
        states
            .iter()
            .find(|state| state.shard == org_shard(shard))
            .expect("the shard's state")
    };
    for shard in [1, 3] {
        let expires = state(shard).lease_expires_at.expect("a lease");
        assert!(
            expires >= asked + Duration::from_secs(590),
            "shard {shard}'s lease runs ten minutes from now: {expires:?}"
        );
    }
    assert_eq!(
        state(2).lease_token,
        Some(taker.lease().token),
        "the worker that took shard 2 over still holds it"
    );
    assert!(
        store
            .extend_leases(&[], Duration::from_secs(1))
            .await
            .expect("nothing to extend")
            .is_empty()
    );
}

/// Three shards of one message each (their ids), claimed by one worker with `options`, but
/// the second under a lease that lapsed at once and another worker's claim of it since: the
/// three sessions, and the other worker's.
async fn three_shards_the_second_taken_over<B: StoreBackend>(
    backend: &B,
    options: ClaimOptions,
) -> (
    Vec<MessageId>,
    [<B::Store as Store>::Session; 3],
    <B::Store as Store>::Session,
) {
    let store = backend.store();
    let ids = write(
        backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(2, 1, 2),
            note::<OrgUpdate>(3, 1, 3),
        ],
    )
    .await;
    let claim = |shard: u64, options: ClaimOptions| {
        let store = store.clone();
        async move {
            store
                .claim(&org_shard(shard), &options)
                .await
                .expect("claim")
        }
    };
    let first = claim(1, options.clone()).await.expect("shard 1");
    let third = claim(3, options.clone()).await.expect("shard 3");
    // Shard 2's lease lapses at once: another worker takes the shard over.
    let lapsing = ClaimOptions {
        lease: Duration::from_millis(1),
        ..options
    };
    let stale = claim(2, lapsing).await.expect("shard 2");
    let mut taken = None;
    eventually_async("another worker takes shard 2 over", async || {
        taken = claim(2, claim_options("other")).await;
        taken.is_some()
    })
    .await;
    (ids, [first, stale, third], taken.expect("taken over"))
}

/// Drained shards finished together count only the rows they deleted: a row a shard's
/// session already acknowledged is not counted again, and its shard is still released, as is
/// the batch's other shard.
pub async fn drained_shards_finished_together_count_only_rows_still_there<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(2, 1, 3),
        ],
    )
    .await;
    let mut first = store
        .claim(&org_shard(1), &claim_options("batch"))
        .await
        .expect("claim")
        .expect("shard 1");
    let mut second = store
        .claim(&org_shard(2), &claim_options("batch"))
        .await
        .expect("claim")
        .expect("shard 2");
    let first_acks = head_acknowledgement(&mut first).await;
    assert_eq!(first_acks.len(), 2, "shard 1's two groups");
    // Shard 1's session acknowledges its first row on its own before the batch.
    assert_eq!(
        first
            .ack(&first_acks[..1])
            .await
            .expect("the first row acknowledged"),
        1
    );
    let second_acks = head_acknowledgement(&mut second).await;
    let results = store
        .ack_and_finish_many(vec![(first, first_acks), (second, second_acks)])
        .await;
    assert!(matches!(results[0], Ok((1, true))), "{:?}", results[0]);
    assert!(matches!(results[1], Ok((1, true))), "{:?}", results[1]);
    assert!(pending_ids(&backend).await.is_empty());
    let states = outbox_core::admin::Admin::shard_states(&store)
        .await
        .expect("shard states");
    assert!(states.is_empty(), "every shard released: {states:?}");
}

/// A handler of `OrgUpdate` that records every delivery and holds shard 1's: `entered` is
/// notified when it starts holding, and it lets go once `release` is notified.
fn slow_on_shard_one(
    recorder: &Recorder,
) -> (
    impl Handler<Delivery<OrgUpdate>> + use<>,
    Arc<Notify>,
    Arc<Notify>,
) {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let handler = {
        let (recorder, entered, release) =
            (recorder.clone(), Arc::clone(&entered), Arc::clone(&release));
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let slow = delivery.shard_identifier() == outbox_core::Id::from(1_i64);
            let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
            async move {
                if slow {
                    entered.notify_one();
                    release.notified().await;
                }
                Ok::<(), BoxError>(())
            }
        }
    };
    (handler, entered, release)
}

/// A shard whose handler is slow holds back none of the shards drained beside it: they are
/// acknowledged while it still runs.
pub async fn a_slow_shard_holds_back_no_other<B: StoreBackend>() {
    let backend = B::create().await;
    let ids = write(
        &backend,
        &(1..=6)
            .map(|shard| note::<OrgUpdate>(shard, 1, shard))
            .collect::<Vec<_>>(),
    )
    .await;
    let recorder = Recorder::new();
    let (handler, entered, release) = slow_on_shard_one(&recorder);
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("slow"),
    );
    let draining = tokio::spawn(async move { relay.drain().await });
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the slow handler started");
    eventually_async("the other shards are acknowledged", async || {
        pending_ids(&backend).await == ids[..1]
    })
    .await;
    release.notify_one();
    let report = draining.await.expect("drain task").expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 6);
    assert!(pending_ids(&backend).await.is_empty());
}

/// A shard claimed in one batch with a slow one is served again as soon as a commit names it,
/// while the slow one still runs: a batch's shards end one by one, not when the slowest does.
/// (The relay polls hourly: only the commit finds the new message.)
pub async fn a_shard_claimed_beside_a_slow_one_is_served_again_while_it_runs<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let (handler, entered, release) = slow_on_shard_one(&recorder);
    let hour = Duration::from_secs(3600);
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("beside-slow")
            .to_builder()
            .poll_interval(hour)
            .min_poll_interval(hour)
            .claim_batch(4)
            .build()
            .expect("a valid relay configuration"),
    );
    let ids = write(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(2, 1, 2)],
    )
    .await;
    let (stop, running) = super::relay::run_until_stopped(&relay);
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the slow handler started");
    eventually_async("shard 2 is acknowledged", async || {
        pending_ids(&backend).await == ids[..1]
    })
    .await;
    // Committed as a service commits, announcing the shard it wrote.
    backend
        .commit(&[note::<OrgUpdate>(2, 2, 3)])
        .await
        .expect("write and commit");
    eventually("the commit's message is delivered", || {
        recorder.in_shard(&org_shard(2)).len() == 2
    })
    .await;
    assert_eq!(
        recorder.in_shard(&org_shard(1)).len(),
        1,
        "the slow shard still runs"
    );
    release.notify_one();
    eventually_async("everything is acknowledged", async || {
        pending_ids(&backend).await.is_empty()
    })
    .await;
    let report = super::relay::stopped(stop, running).await;
    assert_eq!(report.deliveries, 3, "{report:?}");
}

/// The relay holds a claim's batch of shards while only `max_concurrent_shards` handlers run:
/// the held shards wait for their turn keeping their leases alive (another relay finds them
/// held, leases after leases), and each is delivered once when its turn comes.
pub async fn held_shards_wait_their_turn_keeping_their_leases<B: StoreBackend>() {
    let backend = B::create().await;
    let shards: Vec<ShardKey> = (1..=5).map(org_shard).collect();
    let recorder = Recorder::new();
    let (gate, mut inside) = super::Gate::new();
    let lease = Duration::from_millis(300);
    let held_config = config("holding")
        .to_builder()
        .lease(lease)
        .max_concurrent_shards(1)
        .claim_batch(5)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(gate.recording::<OrgUpdate>(&recorder)),
        held_config,
    );
    paced(&relay);
    write_one_per_shard(&backend, 5).await;
    let draining = tokio::spawn(async move { relay.drain().await });
    inside.recv().await.expect("the first handler runs");

    let other = Relay::with_config(
        backend.connect_store().await,
        recorder.registry(),
        config("other")
            .to_builder()
            .lease(lease)
            .build()
            .expect("a valid relay configuration"),
    );
    for _ in 0..4 {
        tokio::time::sleep(lease).await;
        let report = other.drain_shards(&shards).await.expect("drain");
        assert_eq!(
            report.shards_claimed, 0,
            "every shard of the batch is held, running or waiting for its turn"
        );
        assert!(
            inside.try_recv().is_err(),
            "one handler at a time: the others wait for the one running"
        );
    }
    gate.open();
    let report = draining.await.expect("drain task").expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 5);
    let mut delivered: Vec<_> = gated(&recorder)
        .iter()
        .map(|seen| seen.shard.clone())
        .collect();
    delivered.sort();
    assert_eq!(delivered, shards, "each shard delivered once");
    assert!(pending(&backend).await.is_empty());
}

/// A running relay serves the shards that commits name before the shards a sweep found that
/// wait for a handler's turn: live traffic does not queue behind a backlog. (Its first
/// handler is held while a sweep's four other shards and then the named one wait; once it
/// lets go, the named shard is served next.)
pub fn a_shard_a_commit_names_is_served_before_a_sweeps_backlog<B: StoreBackend>() {
    let order =
        served_after_a_commit_names::<B>(9, |probe| waiting_for_a_turn(probe, "Urgent") == 1);
    assert_eq!(
        order[1],
        org_shard(9),
        "the shard a commit named is served right after the one that was running: {order:?}"
    );
}

/// A commit on a shard that a sweep's batch holds already, waiting for its turn behind the
/// batch's other shards, promotes it: it is served next, before the shards that waited
/// longer. (The sweep found the shard before the commit's notification came.)
pub fn a_held_shard_a_commit_names_is_served_before_the_rest_of_the_batch<B: StoreBackend>() {
    let order = served_after_a_commit_names::<B>(4, |probe| {
        probe.events().iter().any(|event| {
            event.message == "a shard a commit named is held already; its turns are urgent"
                && event.field("waiting") == Some("true")
        })
    });
    assert_eq!(
        order[1],
        org_shard(4),
        "the held shard a commit named is served right after the one that was running: \
         {order:?}"
    );
}

/// How many shards waited for a handler's turn in `lane`.
fn waiting_for_a_turn(probe: &crate::telemetry::Probe, lane: &str) -> usize {
    probe
        .events()
        .iter()
        .filter(|event| {
            event.message == "waiting for a handler's turn" && event.field("lane") == Some(lane)
        })
        .count()
}

/// A running relay with one handler slot, polling hourly: a sweep finds shards 1 to 5, whose
/// first handler is held while the four others wait for their turns; then a commit names shard
/// `named`, and once `heard` holds the handler lets go. The shards in the order they were
/// served (six deliveries).
fn served_after_a_commit_names<B: StoreBackend>(
    named: i64,
    heard: impl Fn(&crate::telemetry::Probe) -> bool,
) -> Vec<ShardKey> {
    let (order, _) = capture(|probe| async move {
        let backend = B::create().await;
        let recorder = Recorder::new();
        let (gate, mut inside) = super::Gate::new();
        let relay = Relay::with_config(
            backend.store(),
            recorder.registry_with::<OrgUpdate>(gate.recording::<OrgUpdate>(&recorder)),
            // Only the first sweep finds shards: the named one is found by its commit.
            config("live-first")
                .to_builder()
                .poll_interval(Duration::from_secs(3600))
                .min_poll_interval(Duration::from_secs(3600))
                .max_concurrent_shards(1)
                .claim_batch(6)
                .build()
                .expect("a valid relay configuration"),
        );
        paced(&relay);
        write_one_per_shard(&backend, 5).await;
        let (stop, running) = super::relay::run_until_stopped(&relay);
        inside.recv().await.expect("the first handler runs");
        eventually("the sweep's other shards wait for their turn", || {
            waiting_for_a_turn(&probe, "Routine") == 4
        })
        .await;
        // Committed as a service commits, announcing the shard it wrote.
        backend
            .commit(&[note::<OrgUpdate>(named, 2, 9)])
            .await
            .expect("write and commit");
        eventually("the relay hears the commit", || heard(&probe)).await;
        gate.open();
        eventually("every shard delivered", || gated(&recorder).len() == 6).await;
        super::relay::stopped(stop, running).await;
        gated(&recorder)
            .into_iter()
            .map(|seen| seen.shard)
            .collect::<Vec<_>>()
    });
    assert_eq!(order.len(), 6, "{order:?}");
    order
}

/// A relay that stops while shards of its batch wait for a handler's turn releases them at
/// once, undelivered, rather than deliver them or leave them to their leases: another relay
/// takes them at once.
pub async fn a_stopping_relay_releases_the_shards_waiting_for_their_turn<B: StoreBackend>() {
    let backend = B::create().await;
    let shards: Vec<ShardKey> = (1..=5).map(org_shard).collect();
    let recorder = Recorder::new();
    let (gate, mut inside) = super::Gate::new();
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(gate.recording::<OrgUpdate>(&recorder)),
        config("stopping")
            .to_builder()
            .max_concurrent_shards(1)
            .claim_batch(5)
            .build()
            .expect("a valid relay configuration"),
    );
    paced(&relay);
    write_one_per_shard(&backend, 5).await;
    let (stop, running) = super::relay::run_until_stopped(&relay);
    inside.recv().await.expect("the first handler runs");
    let store = backend.store();
    eventually_async("the whole batch is held", async || {
        leased(&store).await == 5
    })
    .await;

    stop.send(()).expect("the relay is running");
    eventually_async(
        "the shards waiting for their turn are released",
        async || leased(&store).await == 1,
    )
    .await;
    gate.open();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the relay stops promptly")
        .expect("relay task")
        .expect("run");
    assert_eq!(report.abandoned, 0);
    assert_eq!(report.deliveries, 1, "{report:?}");
    assert_eq!(
        gated(&recorder).len(),
        1,
        "the waiting shards were not delivered"
    );

    let other = Relay::with_config(backend.store(), recorder.registry(), config("other"));
    let report = other.drain_shards(&shards).await.expect("drain");
    assert_eq!(
        (report.deliveries, report.rows_acknowledged),
        (4, 4),
        "released, not left to their leases: {report:?}"
    );
    assert!(pending(&backend).await.is_empty());
}

/// A handler may write and flush more outbox messages while it holds the relay's only handler
/// slot: the flush's drains run outside the slots, so it neither waits for itself nor hangs.
pub async fn a_handler_may_flush_what_it_writes<B: StoreBackend>() {
    let backend = Arc::new(B::create().await);
    let recorder = Recorder::new();
    let relay_of_handler: Arc<std::sync::OnceLock<Relay<B::Store>>> = Arc::default();
    // The handler reaches its relay through a weak reference: a strong one would make a
    // cycle (the relay holds the handler), and the test's database would never be dropped.
    let handler = {
        let (backend, recorder, relay) = (
            Arc::clone(&backend),
            recorder.clone(),
            Arc::downgrade(&relay_of_handler),
        );
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let (backend, relay) = (Arc::clone(&backend), relay.upgrade());
            async move {
                let written = backend.commit(&[note::<AuditEvent>(2, 1, 2)]).await?;
                let relay = relay
                    .as_deref()
                    .and_then(std::sync::OnceLock::get)
                    .expect("the relay is built");
                relay.flush(&written).await?;
                Ok::<(), BoxError>(())
            }
        }
    };
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("flushing")
            .to_builder()
            .max_concurrent_shards(1)
            .build()
            .expect("a valid relay configuration"),
    );
    let _ = relay_of_handler.set(relay.clone());
    write(&*backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let report = tokio::time::timeout(Duration::from_secs(15), relay.drain())
        .await
        .expect("the handler's flush does not wait for the slot its handler holds")
        .expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let categories: Vec<&str> = recorder.seen().iter().map(|seen| seen.category).collect();
    assert_eq!(
        categories,
        ["org_update", "audit_event"],
        "the flushed message was delivered inside the handler"
    );
    assert!(pending(&*backend).await.is_empty());
}

/// Pins `relay`'s pace at a quick handler's (0.1 ms a turn), as a relay at work measures it:
/// until it has measured one, it holds no more shards than run at once, and the tests of held
/// shards need it to hold a batch. Pinned, not measured: on a busy machine one turn preempted
/// for a few milliseconds would leave the relay holding fewer shards than the test steps.
fn paced<S: Store>(relay: &Relay<S>) {
    outbox_core::__private::assume_turns_take(relay, Duration::from_micros(100));
}

/// One update in each of the shards 1 to `shards`.
async fn write_one_per_shard<B: StoreBackend>(backend: &B, shards: i64) {
    let updates: Vec<_> = (1..=shards)
        .map(|shard| note::<OrgUpdate>(shard, 1, shard as u64))
        .collect();
    write(backend, &updates).await;
}

/// The deliveries of updates: those the gate held.
fn gated(recorder: &Recorder) -> Vec<crate::fixtures::Seen> {
    recorder
        .seen()
        .into_iter()
        .filter(|seen| seen.category == "org_update")
        .collect()
}

/// How many shards a lease holds now.
async fn leased<S: outbox_core::admin::Admin>(store: &S) -> usize {
    outbox_core::admin::Admin::shard_states(store)
        .await
        .expect("shard states")
        .iter()
        .filter(|state| state.lease_owner.is_some())
        .count()
}

struct WritesInTransaction<B>(PhantomData<fn() -> B>);

impl<B: TestBackend> Handler<Delivery<OrgUpdate>> for WritesInTransaction<B> {
    async fn call(
        &self,
        delivery: Delivery<OrgUpdate>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        B::insert_business_row_in(cx, int(delivery.object_identifier) * 1000).await?;
        if delivery.object_identifier == 2 {
            return Err("failing after writing: the write must roll back".into());
        }
        Ok(())
    }
}

/// In the opt-in in-transaction mode the handler gets the claiming transaction: its
/// writes commit with the acknowledgement, and a failing handler's writes roll back.
pub async fn s16_in_transaction_handler_commits_with_the_acknowledgement<B: TestBackend>() {
    let backend = B::create().await;
    let config = config("in-transaction")
        .to_builder()
        .handler_mode(HandlerMode::InTransaction)
        .build()
        .expect("a valid relay configuration");
    let registry =
        Recorder::new().registry_with::<OrgUpdate>(WritesInTransaction::<B>(PhantomData));
    let relay = Relay::with_config(backend.store(), registry, config);
    let ids = write(
        &backend,
        &[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(1, 2, 2)],
    )
    .await;

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.deliveries, 1);
    assert_eq!(report.failures.len(), 1);
    assert!(
        backend.business_row_exists(1000).await,
        "the handler's write committed"
    );
    assert!(
        !backend.business_row_exists(2000).await,
        "the failed handler's write rolled back"
    );
    let left = pending_ids(&backend).await;
    assert_eq!(
        left,
        [ids[1]],
        "acknowledged with the handler's write, and only that"
    );
}

/// A handler that signals it started, then never finishes.
pub(crate) struct Stuck {
    entered: Arc<Notify>,
}

impl Stuck {
    pub(crate) fn new(entered: Arc<Notify>) -> Self {
        Self { entered }
    }
}

impl Handler<Delivery<OrgUpdate>> for Stuck {
    async fn call(
        &self,
        _delivery: Delivery<OrgUpdate>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self.entered.notify_one();
        std::future::pending().await
    }
}

/// A worker that dies in the middle of a handler loses nothing: once its lease lapses,
/// another worker resumes the shard from the same group, in order.
pub async fn s17_crashed_worker_is_resumed_in_order<B: StoreBackend>() {
    let backend = B::create().await;
    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<AuditEvent>(1, 2, 2),
            note::<AuditEvent>(1, 2, 3),
        ],
    )
    .await;

    let entered = Arc::new(Notify::new());
    let crashing = config("crashing")
        .to_builder()
        .lease(Duration::from_millis(400))
        .build()
        .expect("a valid relay configuration");
    let doomed = Relay::with_config(
        backend.store(),
        Recorder::new().registry_with::<OrgUpdate>(Stuck::new(Arc::clone(&entered))),
        crashing,
    );
    let run = tokio::spawn(async move { doomed.drain().await });
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the doomed worker's handler started");
    run.abort();
    assert!(
        run.await.is_err_and(|error| error.is_cancelled()),
        "the worker was killed"
    );

    let survivor = Recorder::new();
    let relay = Relay::with_config(
        backend.connect_store().await,
        survivor.registry(),
        config("survivor"),
    );
    assert_eq!(
        relay.drain().await.expect("drain").shards_claimed,
        0,
        "the shard stays leased to the dead worker until the lease lapses"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    relay.drain().await.expect("drain");
    assert_eq!(
        survivor.triples(),
        [
            ("org_update", 1, 1),
            ("audit_event", 2, 2),
            ("audit_event", 2, 3)
        ]
    );
    assert!(pending(&backend).await.is_empty());
}

/// A crash after a handler ran but before its acknowledgement means the message is
/// delivered again (at least once), never lost.
pub async fn s17_crash_between_delivery_and_acknowledgement_redelivers<B: StoreBackend>() {
    let backend = B::create().await;
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;

    let mut options = claim_options("crashes-before-ack");
    options.lease = Duration::from_millis(300);
    let mut session = backend
        .store()
        .claim(&org_shard(1), &options)
        .await
        .expect("claim")
        .expect("due");
    assert_eq!(
        session.fetch(10).await.expect("fetch").len(),
        1,
        "the worker read the message"
    );
    drop(session); // delivered, then crashed: no acknowledgement

    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("redeliver"));
    let recorded = recorder.clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.drain().await.expect("drain");
    eventually("the message is delivered again", || {
        recorded.seen().len() == 1
    })
    .await;
    assert_eq!(recorder.triples(), [("org_update", 1, 1)]);
    assert!(pending(&backend).await.is_empty());
}

/// A handler slower than the lease keeps its shard: the relay extends the lease while
/// the handler runs (a heartbeat), so another worker cannot take the shard over and deliver it
/// a second time; the slow delivery is acknowledged by its own worker.
pub async fn s16_a_long_handler_keeps_its_lease<B: StoreBackend>() {
    let backend = B::create().await;
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let recorder = Recorder::new();
    let (gate, mut inside) = super::Gate::new();
    let slow = gate.recording::<OrgUpdate>(&recorder);
    let lease = Duration::from_millis(300);
    let slow_config = config("slow")
        .to_builder()
        .lease(lease)
        .build()
        .expect("a valid relay configuration");
    let slow_relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(slow),
        slow_config,
    );
    let slow_run = tokio::spawn({
        let relay = slow_relay.clone();
        async move { relay.drain_shards(&[org_shard(1)]).await }
    });
    inside.recv().await.expect("the slow handler runs");

    // Several leases pass while the handler runs; another worker finds the shard held.
    let other_config = config("other")
        .to_builder()
        .lease(lease)
        .build()
        .expect("a valid relay configuration");
    let other = Relay::with_config(
        backend.connect_store().await,
        recorder.registry(),
        other_config,
    );
    for _ in 0..4 {
        tokio::time::sleep(lease).await;
        let report = other.drain_shards(&[org_shard(1)]).await.expect("drain");
        assert_eq!(
            report.shards_claimed, 0,
            "the shard is still held by the live, slow worker"
        );
    }
    gate.open();
    let report = slow_run.await.expect("slow task").expect("slow drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.rows_acknowledged, 1);
    assert_eq!(recorder.seen().len(), 1, "delivered once");
    assert!(pending(&backend).await.is_empty());
}

/// A worker whose lease lapsed and was taken over while a handler ran delivers nothing more
/// of its read: the worker that took the shard over delivers the whole read again, each
/// delivery a retry, and the lapsed worker, once its handler returns, learns it lost the
/// lease before its next delivery instead of making a second, unmarked one. (Its handler
/// holds its thread, so that no heartbeat extends the lease meanwhile: a database that does
/// not answer the heartbeat in time is the same to the lease.)
pub async fn a_worker_whose_lease_lapsed_delivers_nothing_more<B: StoreBackend>() {
    let backend = B::create().await;
    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<AuditEvent>(1, 2, 2),
            note::<AuditEvent>(1, 3, 3),
        ],
    )
    .await;
    let lapsing = Recorder::new();
    let entered = Arc::new(Notify::new());
    let (release, released) = std::sync::mpsc::channel();
    let holding = HoldsItsThread {
        recorder: lapsing.clone(),
        entered: Arc::clone(&entered),
        released: Mutex::new(released),
    };
    let lapsing_config = config("lapsing")
        .to_builder()
        .lease(Duration::from_millis(300))
        .build()
        .expect("a valid relay configuration");
    let lapsing_relay = Relay::with_config(
        backend.store(),
        lapsing.registry_with::<OrgUpdate>(holding),
        lapsing_config,
    );
    let lapsing_run =
        tokio::spawn(async move { lapsing_relay.drain_shards(&[org_shard(1)]).await });
    tokio::time::timeout(Duration::from_secs(15), entered.notified())
        .await
        .expect("the first handler runs");

    let taker = Recorder::new();
    let taking = Relay::with_config(
        backend.connect_store().await,
        taker.registry(),
        config("taker"),
    );
    eventually_async("another worker takes the lapsed shard over", async || {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let report = taking.drain_shards(&[org_shard(1)]).await.expect("drain");
        report.shards_claimed == 1
    })
    .await;
    let retries: Vec<_> = taker
        .seen()
        .iter()
        .map(|seen| (seen.category, seen.seq, seen.attempt))
        .collect();
    assert_eq!(
        retries,
        [
            ("org_update", 1, 2),
            ("audit_event", 2, 2),
            ("audit_event", 3, 2)
        ],
        "the read again, each delivery a retry"
    );

    release.send(()).expect("the held handler waits");
    let report = lapsing_run
        .await
        .expect("the lapsing worker's task")
        .expect("its drain");
    assert_eq!(
        lapsing.triples(),
        [("org_update", 1, 1)],
        "nothing delivered after the lease lapsed"
    );
    assert_eq!(report.lost_leases, [org_shard(1)], "{report:?}");
    assert_eq!(report.rows_acknowledged, 0);
    assert!(pending(&backend).await.is_empty());
}

/// Records a delivery, says so, then holds its thread until released: no other part of its
/// task (the lease's heartbeat) runs meanwhile. The runtime's other tasks go on on other
/// threads.
struct HoldsItsThread {
    recorder: Recorder,
    entered: Arc<Notify>,
    released: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Handler<Delivery<OrgUpdate>> for HoldsItsThread {
    async fn call(
        &self,
        delivery: Delivery<OrgUpdate>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self.recorder.record(&delivery);
        self.entered.notify_one();
        tokio::task::block_in_place(|| {
            let _ = self
                .released
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .recv();
        });
        Ok(())
    }
}

/// A claim that lapses without a release (its worker died, perhaps after delivering)
/// counts as an attempt: the redelivery says `attempt = 2`, then 3, so a handler can tell a
/// retry; the new claim names the worker it took the shard over from.
pub async fn s17_a_lapsed_claim_counts_as_an_attempt<B: StoreBackend>() {
    let backend = B::create().await;
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let shard = org_shard(1);
    let store = backend.store();
    let mut options = claim_options("crashed");
    options.lease = Duration::from_millis(100);

    let first = store
        .claim(&shard, &options)
        .await
        .expect("claim")
        .expect("due");
    assert_eq!(
        (first.lease().attempts, first.lease().previous_owner.clone()),
        (0, None)
    );
    drop(first); // crashed: never released
    tokio::time::sleep(Duration::from_millis(150)).await;
    options.worker = "crashed-again".to_owned();
    let second = store
        .claim(&shard, &options)
        .await
        .expect("claim")
        .expect("the lapsed lease is taken over");
    assert_eq!(second.lease().attempts, 1);
    assert_eq!(second.lease().previous_owner.as_deref(), Some("crashed"));
    drop(second);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let recorder = Recorder::new();
    let relay = Relay::with_config(store.clone(), recorder.registry(), config("survivor"));
    relay.drain().await.expect("drain");
    let seen = recorder.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].attempt, 3, "the third claim of the head");

    // A clean drain counts nothing: the next message is on its first attempt.
    write(&backend, &[note::<OrgUpdate>(1, 2, 2)]).await;
    relay.drain().await.expect("drain");
    assert_eq!(recorder.seen()[1].attempt, 1);
}

/// Exclusive claims of several shards at once ([`Store::claim_many`]): workers with
/// connections of their own claim overlapping sets of shards, in different orders, at the
/// same instant. Each due shard is claimed exactly once, with a fencing token greater than
/// every earlier one; a shard another worker holds, a paused shard and a shard backing off
/// are left alone, and a lapsed lease is taken over as a single claim takes it (an attempt
/// more, and its previous owner). Each session reads its own shard's head (which a backend may
/// have read with the claim).
pub async fn s15_claiming_many_shards_grants_each_once<B: StoreBackend>() {
    use outbox_core::admin::Admin;
    use outbox_core::store::PauseTarget;

    let backend = B::create().await;
    let shards: Vec<i64> = (1..=24).collect();
    let messages: Vec<_> = shards
        .iter()
        .map(|&shard| note::<OrgUpdate>(shard, 1, u64::try_from(shard).expect("small")))
        .collect();
    let ids = write(&backend, &messages).await;
    let newest = ids.iter().copied().max().expect("written");
    let store = backend.store();

    // Shard 3 is held, 4 paused, 5 backing off; 6's lease lapses.
    let held = store
        .claim(&org_shard(3), &claim_options("holder"))
        .await
        .expect("claim")
        .expect("due");
    store
        .pause(&PauseTarget::Shard(org_shard(4)), Some("test"))
        .await
        .expect("pause");
    failed_once(&store, 5, 1, Duration::from_secs(3600), newest).await;
    let earlier = held.lease().token.max(crashed_holding(&store, 6).await);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let contenders = 4;
    let barrier = Arc::new(Barrier::new(contenders));
    let mut tasks = Vec::new();
    for worker in 0..contenders {
        let store = backend.connect_store().await;
        let barrier = Arc::clone(&barrier);
        // Each asks for most shards, in its own order, one of them twice.
        let mut wanted: Vec<ShardKey> = shards
            .iter()
            .filter(|&&shard| shard % 4 != i64::try_from(worker).expect("small"))
            .map(|&shard| org_shard(shard))
            .collect();
        wanted.rotate_left(worker * 5);
        if worker % 2 == 1 {
            wanted.reverse();
        }
        wanted.push(wanted[0].clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .claim_many(&wanted, &claim_options(&format!("worker-{worker}")), 10)
                .await
                .expect("claiming does not fail")
        }));
    }
    let mut claimed: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut sessions = Vec::new();
    for task in tasks {
        for session in task.await.expect("claim task") {
            let lease = session.lease();
            assert!(
                lease.token > earlier,
                "fencing tokens increase: {} after {earlier}",
                lease.token
            );
            claimed
                .entry(int(lease.shard.shard_identifier))
                .or_default()
                .push(lease.token);
            sessions.push(session);
        }
    }
    let expected: Vec<i64> = shards
        .iter()
        .copied()
        .filter(|shard| ![3, 4, 5].contains(shard))
        .collect();
    assert_eq!(
        claimed.keys().copied().collect::<Vec<_>>(),
        expected,
        "every due shard, and only those"
    );
    for (shard, tokens) in &claimed {
        assert_eq!(tokens.len(), 1, "shard {shard} was claimed more than once");
    }
    let taken_over = sessions
        .iter()
        .find(|session| int(session.lease().shard.shard_identifier) == 6)
        .expect("shard 6 claimed");
    assert_eq!(
        taken_over.lease().attempts,
        1,
        "a lapsed claim is an attempt"
    );
    assert_eq!(
        taken_over.lease().previous_owner.as_deref(),
        Some("crashed")
    );
    let untouched = sessions
        .iter()
        .find(|session| int(session.lease().shard.shard_identifier) == 7)
        .expect("shard 7 claimed");
    assert_eq!(
        (
            untouched.lease().attempts,
            untouched.lease().previous_owner.clone()
        ),
        (0, None)
    );
    for mut session in sessions {
        let head = session.fetch(10).await.expect("fetch");
        assert_eq!(head.len(), 1, "each claimed shard reads its own message");
        session.finish(Outcome::Drained).await.expect("release");
    }
    held.finish(Outcome::Yielded).await.expect("release");
}

/// Shards claimed together, every one of them due, each report what their own state says:
/// none (no attempt, nobody before), a lapsed lease (an attempt, and who held it), a failure
/// whose retry is due (its attempts). A backend that knows a batch's claims from their count
/// alone must know when it cannot.
pub async fn shards_claimed_together_report_their_own_attempts_and_holders<B: StoreBackend>() {
    let backend = B::create().await;
    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(31, 1, 1),
            note::<OrgUpdate>(32, 1, 2),
            note::<OrgUpdate>(33, 1, 3),
        ],
    )
    .await;
    let store = backend.store();
    crashed_holding(&store, 32).await;
    let newest = ids.iter().copied().max().expect("written");
    failed_once(&store, 33, 2, Duration::ZERO, newest).await;
    tokio::time::sleep(Duration::from_millis(150)).await;

    let sessions = store
        .claim_many(
            &[org_shard(31), org_shard(32), org_shard(33)],
            &claim_options("worker"),
            10,
        )
        .await
        .expect("claim many");
    let mut claimed: Vec<(i64, u32, Option<String>)> = sessions
        .iter()
        .map(|session| {
            let lease = session.lease();
            (
                int(lease.shard.shard_identifier),
                lease.attempts,
                lease.previous_owner.clone(),
            )
        })
        .collect();
    claimed.sort();
    assert_eq!(
        claimed,
        vec![
            (31, 0, None),
            (32, 1, Some("crashed".to_owned())),
            (33, 2, None),
        ]
    );
}

/// Org shard `shard` claimed by "crashed" for 100 ms and never released (its session dropped):
/// the lease lapses then. Its token.
async fn crashed_holding<S: Store>(store: &S, shard: i64) -> i64 {
    let mut short = claim_options("crashed");
    short.lease = Duration::from_millis(100);
    let lapsing = store
        .claim(&org_shard(shard), &short)
        .await
        .expect("claim")
        .expect("due");
    lapsing.lease().token
}

/// Org shard `shard` claimed by "failing" and finished as its `attempts`-th failure, retried
/// after `retry_in`, its rows up to `watermark` seen.
async fn failed_once<S: Store>(
    store: &S,
    shard: i64,
    attempts: u32,
    retry_in: Duration,
    watermark: MessageId,
) {
    let failing = store
        .claim(&org_shard(shard), &claim_options("failing"))
        .await
        .expect("claim")
        .expect("due");
    failing
        .finish(Outcome::Failed(outbox_core::store::Failure {
            error: "down".to_owned(),
            attempts,
            retry_in,
            watermark,
            parked_category: None,
        }))
        .await
        .expect("back off");
}
