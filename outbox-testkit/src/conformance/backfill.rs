//! Backfill (SPEC §11): a started backfill walks a replicated model's existing rows in key
//! order, a batch per tick behind the backlog, writes each row's outbox as a save would, and
//! records its progress on a watermark that survives restarts and concurrent relays.

use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillOutcome, BackfillPhase, BackfillStart,
    BackfillState,
};
use outbox_core::store::Store;
use outbox_core::{Category, Destination, Error, Message, ModelBatch, Registry, Relay};

use super::{config, eventually, int, pending};
use crate::backend::{ModelWrite, TestBackend};
use crate::fixtures::{MODEL_TABLES, Member, ModelRecorder, ModelSeen, OrgUpdate, Project, note};

/// A backend with the model tables, and projects of the given ids written behind the
/// outbox's back (as rows that predate the model's replication are), in the order given.
async fn with_projects<B: TestBackend>(ids: &[i64]) -> B {
    let backend = B::create().await;
    for ddl in MODEL_TABLES {
        backend.execute(ddl).await;
    }
    insert_projects(&backend, ids).await;
    backend
}

async fn insert_projects<B: TestBackend>(backend: &B, ids: &[i64]) {
    for id in ids {
        backend
            .execute(&format!(
                "INSERT INTO projects (id, organization_id, name, archived, score) \
                 VALUES ({id}, {}, 'p{id}', FALSE, 1.5)",
                id % 3
            ))
            .await;
    }
}

fn options(budget: usize) -> BackfillOptions {
    BackfillOptions {
        worker: "backfill-test".to_owned(),
        budget,
    }
}

/// A binary whose code declares `version` of model `M`.
fn code<M: outbox_core::ReplicatedModel>(version: u32) -> BackfillModel {
    let mut model = BackfillModel::of::<M>();
    model.version = version;
    model
}

async fn tick<S: Store>(store: &S, model: &BackfillModel, budget: usize) -> BackfillBatch {
    store
        .backfill(model, &options(budget))
        .await
        .unwrap_or_else(|error| {
            panic!(
                "a backfill tick: {}",
                outbox_core::error::error_chain(&error)
            )
        })
}

async fn start<B: TestBackend>(backend: &B, start: BackfillStart) -> BackfillState {
    backend
        .store()
        .start_backfill(&start)
        .await
        .expect("start a backfill")
}

async fn watermark<B: TestBackend, C: Category>(backend: &B) -> BackfillState {
    backend
        .store()
        .backfills()
        .await
        .expect("list backfills")
        .into_iter()
        .find(|state| state.category == C::ID)
        .expect("the model has a watermark")
}

/// The objects of the pending messages of category `C`, in id order.
async fn pending_objects<B: TestBackend, C: Category>(backend: &B) -> Vec<i64> {
    pending(backend)
        .await
        .iter()
        .filter(|row| row.category == C::ID)
        .map(|row| int(row.object_identifier))
        .collect()
}

fn walked(batch: &BackfillBatch) -> (usize, usize, bool) {
    match batch.outcome {
        BackfillOutcome::Walked {
            size,
            rows,
            complete,
            ..
        } => (size, rows, complete),
        ref other => panic!("expected a batch walked, got {other:?}"),
    }
}

fn registry(recorder: &ModelRecorder) -> Registry {
    recorder
        .register(Registry::builder())
        .build()
        .expect("the test models do not conflict")
}

/// A new replication version is inert until an operator starts its backfill, and a binary
/// whose code declares an older version does not walk a backfill started to a newer one.
pub async fn a_backfill_waits_for_its_start<B: TestBackend>() {
    let backend = with_projects::<B>(&[1, 2, 3]).await;
    let store = backend.store();
    let batch = tick(&store, &code::<Project>(2), 100).await;
    assert_eq!(batch.outcome, BackfillOutcome::Gated);
    assert!(
        pending(&backend).await.is_empty(),
        "nothing before the gate"
    );
    let recorded = watermark::<B, Project>(&backend).await;
    assert_eq!(
        (
            recorded.model.as_str(),
            recorded.declared_version,
            recorded.target_version,
            recorded.phase()
        ),
        ("project", 2, 0, BackfillPhase::NotStarted),
        "a relay records the model and its code's version: {recorded:?}"
    );

    let started = start(&backend, BackfillStart::new(Project::ID, 2)).await;
    assert_eq!(started.phase(), BackfillPhase::Walking);
    let older = tick(&store, &code::<Project>(1), 100).await;
    assert_eq!(older.outcome, BackfillOutcome::Gated, "older code waits");
    assert!(pending(&backend).await.is_empty());
    let newer = tick(&store, &code::<Project>(3), 100).await;
    assert_eq!(walked(&newer), (100, 3, true), "newer code walks version 2");
    assert_eq!(pending_objects::<B, Project>(&backend).await, [1, 2, 3]);
}

/// Batches of the budget's size walk the rows in key order (not insertion order), each
/// moving the watermark; the batch that finds fewer rows completes the walk; rows written
/// afterwards are not walked (their own writes have outboxes); a higher version walks the
/// table again from its lowest key. Each outbox is the one a save would write.
pub async fn a_backfill_walks_batches_in_key_order_to_completion<B: TestBackend>() {
    let backend = with_projects::<B>(&[13, 2, 21, 1, 8, 3, 5]).await;
    let recorder = ModelRecorder::default();
    let relay = Relay::with_config(backend.store(), registry(&recorder), config("backfill"));
    let store = backend.store();
    let v2 = code::<Project>(2);
    start(&backend, BackfillStart::new(Project::ID, 2)).await;

    let mut lows = Vec::new();
    for expected in [[1, 2, 3], [5, 8, 13]] {
        let batch = tick(&store, &v2, 3).await;
        assert_eq!(walked(&batch), (3, 3, false));
        assert_eq!(pending_objects::<B, Project>(&backend).await, expected);
        let state = batch.state.expect("a walked batch has a state");
        assert_eq!(state, watermark::<B, Project>(&backend).await);
        lows.push((
            state.low_bound.map(int),
            state.rows_walked,
            state.done_version,
        ));
        relay.drain().await.expect("drain");
    }
    assert_eq!(lows, [(Some(3), 3, 0), (Some(13), 6, 0)]);
    let seen = recorder.take();
    assert_eq!(seen.len(), 6, "each walked row replicated: {seen:?}");
    assert!(
        seen.iter()
            .all(|seen| matches!(seen, ModelSeen::Project(p, shard) if p.name == format!("p{}", p.id) && int(shard.shard_identifier) == p.id % 3)),
        "the outboxes are a save's: the model's shard, read back at delivery: {seen:?}"
    );

    let last = tick(&store, &v2, 3).await;
    assert_eq!(walked(&last), (3, 1, true));
    let done = watermark::<B, Project>(&backend).await;
    assert_eq!(
        (
            done.done_version,
            done.low_bound,
            done.rows_walked,
            done.phase()
        ),
        (2, None, 7, BackfillPhase::Done)
    );
    assert!(done.completed_at.is_some() && done.started_at.is_some());
    relay.drain().await.expect("drain");

    // Written after completion: its own write's outbox, and no walk.
    backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::local(&Project::new(100, 1, "new")),
            true,
        )
        .await
        .expect("insert");
    assert_eq!(tick(&store, &v2, 3).await.outcome, BackfillOutcome::Gated);
    assert_eq!(pending_objects::<B, Project>(&backend).await, [100]);
    relay.drain().await.expect("drain");

    // Version 3: from the lowest key again.
    let v3 = code::<Project>(3);
    start(&backend, BackfillStart::new(Project::ID, 3)).await;
    let again = tick(&store, &v3, 3).await;
    assert_eq!(walked(&again), (3, 3, false));
    assert_eq!(pending_objects::<B, Project>(&backend).await, [1, 2, 3]);
    let state = again.state.expect("a state");
    assert_eq!(
        (state.walking_version, state.done_version, state.rows_walked),
        (3, 2, 3),
        "a new walk counts its own rows"
    );
}

/// Each tick walks at most the budget less the pending messages, and never fewer than one
/// row: a backlog larger than the budget slows the walk to a row per tick without reading as
/// the end of the table.
pub async fn a_backfill_gives_way_to_the_backlog_and_never_stops_short<B: TestBackend>() {
    let backend = with_projects::<B>(&(1..=10).collect::<Vec<_>>()).await;
    let store = backend.store();
    let v2 = code::<Project>(2);
    start(&backend, BackfillStart::new(Project::ID, 2)).await;
    let live: Vec<Message> = (0..5).map(|seq| note::<OrgUpdate>(1, seq, seq)).collect();
    backend.write(&live).await.expect("live traffic");

    let batch = tick(&store, &v2, 8).await;
    assert_eq!(walked(&batch), (3, 3, false), "8 less a backlog of 5");
    // The backlog is now 8: the budget is spent, and a batch is still one row.
    for expected_low in [4, 5] {
        let batch = tick(&store, &v2, 8).await;
        assert_eq!(walked(&batch), (1, 1, false));
        let state = batch.state.expect("a state");
        assert_eq!(state.low_bound.map(int), Some(expected_low));
        assert_eq!(state.done_version, 0, "a batch of one row is not the end");
    }
    assert_eq!(
        pending_objects::<B, Project>(&backend).await,
        [1, 2, 3, 4, 5]
    );
}

/// A fan-out model's backfill writes each row's outbox to the destinations the row names, or
/// to those of them the operator restricted it to; its payload is the row's tombstone.
pub async fn a_fan_out_backfill_reaches_the_destinations_each_row_names<B: TestBackend>() {
    let backend = with_projects::<B>(&[]).await;
    for (id, org) in [(1, 2), (2, 3), (3, 4)] {
        backend
            .execute(&format!(
                "INSERT INTO members (member_id, org, email) VALUES ({id}, {org}, 'm{id}@x')"
            ))
            .await;
    }
    let store = backend.store();
    let model = code::<Member>(1);
    start(&backend, BackfillStart::new(Member::ID, 1)).await;
    assert_eq!(walked(&tick(&store, &model, 100).await), (100, 3, true));
    let routed = |rows: Vec<outbox_core::store::PendingMessage>| -> Vec<(i64, String, String)> {
        rows.into_iter()
            .map(|row| {
                (
                    int(row.object_identifier),
                    row.shard.destination_str().to_owned(),
                    row.payload_value()["email"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                )
            })
            .collect()
    };
    let expected = |only: &[(i64, &str)]| -> Vec<(i64, String, String)> {
        only.iter()
            .map(|(id, d)| (*id, (*d).to_owned(), format!("m{id}@x")))
            .collect()
    };
    let mut sorted = routed(pending(&backend).await);
    sorted.sort();
    assert_eq!(
        sorted,
        expected(&[(1, "eu"), (1, "us"), (2, "us"), (3, "eu"), (3, "us")])
    );
    let recorder = ModelRecorder::default();
    Relay::with_config(backend.store(), registry(&recorder), config("members"))
        .drain()
        .await
        .expect("drain");

    let eu = Destination::new("eu").expect("valid");
    start(
        &backend,
        BackfillStart::new(Member::ID, 2).destinations([eu.clone()]),
    )
    .await;
    assert_eq!(
        watermark::<B, Member>(&backend).await.destinations,
        Some(vec![eu])
    );
    assert_eq!(
        walked(&tick(&store, &code::<Member>(2), 100).await),
        (100, 3, true)
    );
    assert_eq!(
        routed(pending(&backend).await),
        expected(&[(1, "eu"), (3, "eu")]),
        "only the restricted destination"
    );
}

/// A batch whose watermark write fails is a typed error, writes no outbox (they roll back
/// with it) and leaves the watermark where it was, with the error recorded; the next tick
/// walks the same rows, each once.
pub async fn a_failed_watermark_write_fails_its_batch<B: TestBackend>() {
    let backend = with_projects::<B>(&[1, 2, 3, 4]).await;
    let store = backend.store();
    let v2 = code::<Project>(2);
    start(&backend, BackfillStart::new(Project::ID, 2)).await;
    backend.refuse_backfill_progress(true).await;
    let error = store
        .backfill(&v2, &options(3))
        .await
        .expect_err("the watermark cannot move");
    assert!(
        matches!(
            &error,
            Error::BackfillWatermark {
                model: "project",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        outbox_core::error::error_chain(&error).contains("refuses to move the watermark"),
        "the cause is in the chain: {}",
        outbox_core::error::error_chain(&error)
    );
    assert!(pending(&backend).await.is_empty(), "the batch rolled back");
    let stuck = watermark::<B, Project>(&backend).await;
    assert_eq!((stuck.low_bound, stuck.rows_walked), (None, 0));
    assert_eq!(
        (stuck.model.as_str(), stuck.declared_version),
        ("project", 2),
        "the relay's declaration outlives its failed first batch: {stuck:?}"
    );
    assert_ne!(stuck.phase(), BackfillPhase::WaitingForCode, "{stuck:?}");
    assert!(
        stuck
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("could not record its progress")),
        "the error is on the watermark: {stuck:?}"
    );

    backend.refuse_backfill_progress(false).await;
    assert_eq!(walked(&tick(&store, &v2, 3).await), (3, 3, false));
    assert_eq!(walked(&tick(&store, &v2, 10).await), (7, 1, true));
    assert_eq!(pending_objects::<B, Project>(&backend).await, [1, 2, 3, 4]);
    assert_eq!(watermark::<B, Project>(&backend).await.last_error, None);
}

/// Pausing stops the walk where it is; starting it again to the same version goes on from
/// there (not from the lowest key).
pub async fn a_paused_backfill_resumes_where_it_stopped<B: TestBackend>() {
    let backend = with_projects::<B>(&[1, 2, 3, 4, 5, 6]).await;
    let store = backend.store();
    let v2 = code::<Project>(2);
    start(&backend, BackfillStart::new(Project::ID, 2)).await;
    assert_eq!(walked(&tick(&store, &v2, 2).await), (2, 2, false));
    assert!(store.pause_backfill(Project::ID).await.expect("pause"));
    assert!(
        !store
            .pause_backfill(Project::ID)
            .await
            .expect("pause again")
    );
    assert_eq!(
        watermark::<B, Project>(&backend).await.phase(),
        BackfillPhase::Paused
    );
    assert_eq!(tick(&store, &v2, 100).await.outcome, BackfillOutcome::Gated);
    assert_eq!(pending_objects::<B, Project>(&backend).await, [1, 2]);

    start(&backend, BackfillStart::new(Project::ID, 2)).await;
    let resumed = tick(&store, &v2, 100).await;
    assert_eq!(walked(&resumed), (98, 4, true));
    assert_eq!(
        pending_objects::<B, Project>(&backend).await,
        [1, 2, 3, 4, 5, 6]
    );
}

/// Relays of two processes ticking one backfill at once never walk the same batch: the rows
/// walked add up to the table, and each row has one outbox.
pub async fn concurrent_relays_never_walk_the_same_batch<B: TestBackend>() {
    const ROWS: i64 = 60;
    let backend = with_projects::<B>(&(1..=ROWS).collect::<Vec<_>>()).await;
    start(&backend, BackfillStart::new(Project::ID, 2)).await;
    let walker = |store: B::Store| async move {
        let v2 = code::<Project>(2);
        let mut rows = 0;
        for _ in 0..400 {
            let batch = tick(&store, &v2, 5).await;
            match batch.outcome {
                BackfillOutcome::Walked { rows: walked, .. } => rows += walked,
                BackfillOutcome::Busy => tokio::task::yield_now().await,
                BackfillOutcome::Gated => return rows,
            }
        }
        panic!("the walk did not end");
    };
    // A batch of 5, then of one row each (the backlog grows with every batch): many batches.
    let first = tokio::spawn(walker(backend.store()));
    let second = tokio::spawn(walker(backend.connect_store().await));
    let (first, second) = (first.await.expect("walker"), second.await.expect("walker"));
    assert_eq!(first + second, ROWS as usize, "{first} + {second}");
    let mut objects = pending_objects::<B, Project>(&backend).await;
    objects.sort_unstable();
    assert_eq!(objects, (1..=ROWS).collect::<Vec<_>>());
}

/// The background relay ticks a started backfill to its end, behind live traffic, and its
/// handlers see every row; the progress is on the watermark.
pub async fn the_relay_walks_a_started_backfill<B: TestBackend>() {
    let backend = with_projects::<B>(&(1..=23).collect::<Vec<_>>()).await;
    let recorder = ModelRecorder::default();
    let relay = Relay::with_config(
        backend.store(),
        registry(&recorder),
        config("backfilling")
            .to_builder()
            .backfill_interval(Some(Duration::from_millis(5)))
            .backfill_budget(4)
            .build()
            .expect("a valid configuration"),
    );
    start(&backend, BackfillStart::new(Project::ID, 2)).await;
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
    let mut seen = std::collections::BTreeSet::new();
    eventually("the relay walked and delivered every row", || {
        for row in recorder.take() {
            if let ModelSeen::Project(project, _) = row {
                seen.insert(project.id);
            }
        }
        seen.len() == 23
    })
    .await;
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay run");
    let done = watermark::<B, Project>(&backend).await;
    assert_eq!((done.phase(), done.rows_walked), (BackfillPhase::Done, 23));
    assert_eq!(seen, (1..=23).collect());
}
