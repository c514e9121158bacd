//! Failures: of handlers, of payloads, of categories this binary does not know, and a missing
//! migration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::{Backoff, BoxError, Category, Delivery, DeliveryError, Error, Relay};

use outbox_core::admin::{Admin, ShardStatus};

use outbox_core::error::error_chain;

use outbox_core::store::Store;

use super::{assert_in, config, pending, pending_ids, state_of, write};
use crate::backend::{StoreBackend, TestBackend};
use crate::fixtures::{FutureCategory, OrgUpdate, Recorder, note, org_shard};

/// A failed handler stops its shard only: groups before it stay acknowledged, it and the
/// groups after it stay pending, and other shards carry on in the same pass.
pub async fn s18_failure_stops_only_its_shard<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let handler = {
        let recorder = recorder.clone();
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let fail = delivery.object_identifier == 2;
            async move {
                if fail {
                    return Err::<(), BoxError>("object 2 cannot be replicated".into());
                }
                Ok(())
            }
        }
    };
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("s18"),
    );
    let ids = write(
        &backend,
        &[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(1, 3, 3),
            note::<OrgUpdate>(2, 4, 4),
            note::<OrgUpdate>(2, 5, 5),
        ],
    )
    .await;

    let report = relay.drain().await.expect("drain");
    let objects = |shard| {
        recorder
            .in_shard(&org_shard(shard))
            .into_iter()
            .map(|seen| seen.object)
            .collect::<Vec<_>>()
    };
    assert_eq!(objects(1), [1, 2], "shard 1 stops at the failing group");
    assert_eq!(objects(2), [4, 5], "shard 2 carries on");
    assert_eq!(report.failures.len(), 1);
    let failure = &report.failures[0];
    assert_eq!(failure.shard, org_shard(1));
    assert!(
        matches!(&failure.error, DeliveryError::Handler { category: "org_update", message_id, .. } if *message_id == ids[1])
    );
    assert!(error_chain(&failure.error).contains("object 2 cannot be replicated"));
    let left = pending_ids(&backend).await;
    assert_eq!(
        left,
        [ids[1], ids[2]],
        "the failed group and the one after it stay pending"
    );
}

/// Backoff is per shard, exponential and capped; attempts and the last error are stored
/// and visible; a new message makes a shard in backoff due at once without resetting the
/// doubling; success resets it.
pub async fn s19_backoff_doubles_caps_and_is_visible<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let recorder = Recorder::new();
    let failing = Arc::new(AtomicBool::new(true));
    let handler = {
        let (recorder, failing) = (recorder.clone(), Arc::clone(&failing));
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let fail = delivery.object_identifier == 1 && failing.load(Ordering::SeqCst);
            async move {
                if fail {
                    return Err::<(), BoxError>("deliberate failure".into());
                }
                Ok(())
            }
        }
    };
    let config = config("s19")
        .to_builder()
        // Without jitter: the test checks each delay of the schedule.
        .backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(5)).with_jitter(false))
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(
        store.clone(),
        recorder.registry_with::<OrgUpdate>(handler),
        config,
    );
    let shard = org_shard(1);

    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    relay.drain().await.expect("drain");
    let state = state_of(&store, &shard)
        .await
        .expect("a failed shard has state");
    assert_eq!(state.attempts, 1);
    assert!(
        state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("deliberate failure"))
    );
    assert_in(state.retry_at, Duration::from_secs(2), "first retry");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.shards_claimed, 0, "a shard in backoff is not due");
    assert_eq!(recorder.seen().len(), 1);

    assert!(store.reschedule(&shard).await.expect("reschedule"));
    relay.drain().await.expect("drain");
    let state = state_of(&store, &shard).await.expect("state");
    assert_eq!(state.attempts, 2);
    assert_in(
        state.retry_at,
        Duration::from_secs(4),
        "second retry doubles",
    );

    assert!(store.reschedule(&shard).await.expect("reschedule"));
    relay.drain().await.expect("drain");
    let state = state_of(&store, &shard).await.expect("state");
    assert_eq!(state.attempts, 3);
    assert_in(
        state.retry_at,
        Duration::from_secs(5),
        "third retry is capped",
    );

    // A new message makes the shard due at once; the head still fails; the count goes on.
    write(&backend, &[note::<OrgUpdate>(1, 2, 2)]).await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        report.shards_claimed, 1,
        "a new message makes a shard in backoff due"
    );
    let state = state_of(&store, &shard).await.expect("state");
    assert_eq!(
        state.attempts, 4,
        "the new message did not reset the doubling"
    );
    assert_in(state.retry_at, Duration::from_secs(5), "still capped");

    failing.store(false, Ordering::SeqCst);
    assert!(store.reschedule(&shard).await.expect("reschedule"));
    relay.drain().await.expect("drain");
    let attempts: Vec<u32> = recorder.seen().iter().map(|seen| seen.attempt).collect();
    assert_eq!(
        attempts,
        [1, 2, 3, 4, 5, 1],
        "handlers see the attempt number"
    );
    assert!(pending(&backend).await.is_empty());
    assert!(
        state_of(&store, &shard)
            .await
            .is_none_or(|state| state.attempts == 0),
        "success resets the shard"
    );
}

/// A message whose category this binary does not know is never deleted; its
/// shard is parked with a clear error, counts no attempt and backs off no more (a new message
/// does not make it due), until a relay that knows the category runs: at its start, or at its
/// upkeep for a shard an older relay parked after it started (a rolling deploy).
pub async fn s20_unknown_category_parks_and_is_never_deleted<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let shard = org_shard(1);
    let old = Recorder::new();
    let old_relay = Relay::with_config(store.clone(), old.registry(), config("old-binary"));
    let new = Recorder::new();
    let new_relay = Relay::with_config(
        store.clone(),
        new.builder()
            .handle::<FutureCategory>(new.handler())
            .build()
            .expect("registry"),
        config("new-binary"),
    );
    // The new binary's relay has started (nothing is parked yet).
    new_relay.drain().await.expect("drain");

    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let unknown = backend
        .insert_raw(
            &shard,
            FutureCategory::ID.0,
            2.into(),
            r#"{"seq":2,"text":"from the future"}"#,
        )
        .await;
    write(&backend, &[note::<OrgUpdate>(1, 3, 3)]).await;

    let report = old_relay.drain().await.expect("drain");
    assert_eq!(
        old.triples(),
        [("org_update", 1, 1)],
        "rows before it are delivered"
    );
    assert!(matches!(
        &report.failures[..],
        [failure] if matches!(failure.error, DeliveryError::UnknownCategory { message_id, category }
            if message_id == unknown && category == FutureCategory::ID)
    ));
    let state = state_of(&store, &shard)
        .await
        .expect("a parked shard has state");
    assert_eq!(state.parked_category, Some(FutureCategory::ID));
    assert_eq!(state.attempts, 0, "a park is not an attempt");
    let error = state.last_error.expect("an error is recorded");
    assert!(
        error.contains("category 99") && error.contains("parked"),
        "{error}"
    );
    let info = store
        .shard(&shard)
        .await
        .expect("a shard")
        .expect("pending");
    assert_eq!((info.status, info.retry_at), (ShardStatus::Parked, None));

    // Parked, not backing off: a new message does not make it due.
    assert_eq!(old_relay.drain().await.expect("drain").shards_claimed, 0);
    write(&backend, &[note::<OrgUpdate>(1, 4, 4)]).await;
    assert_eq!(old_relay.drain().await.expect("drain").shards_claimed, 0);
    assert_eq!(pending(&backend).await.len(), 3, "nothing was deleted");
    assert_eq!(
        state_of(&store, &shard).await.map(|state| state.attempts),
        Some(0)
    );

    // The new relay started before the park: its upkeep resumes the shard.
    assert_eq!(new_relay.drain().await.expect("drain").shards_claimed, 0);
    assert_eq!(new_relay.maintain().await.expect("upkeep").unparked, 1);
    new_relay.drain().await.expect("drain");
    assert_eq!(
        new.triples(),
        [
            ("future_category", 2, 2),
            ("org_update", 3, 3),
            ("org_update", 4, 4)
        ]
    );
    assert!(pending(&backend).await.is_empty());
}

/// A payload that no longer deserializes is a handler failure with a precise error (the
/// message, the category, the position), not a panic; the row is kept and other shards go on.
pub async fn s21_malformed_payload_is_a_precise_failure<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s21"));

    let bad = backend
        .insert_raw(
            &org_shard(1),
            OrgUpdate::ID.0,
            1.into(),
            r#"{"seq":"seven","text":"x"}"#,
        )
        .await;
    write(&backend, &[note::<OrgUpdate>(2, 2, 2)]).await;

    let report = relay
        .drain()
        .await
        .expect("a bad payload does not fail the drain");
    assert_eq!(recorder.triples(), [("org_update", 2, 2)]);
    assert_eq!(report.failures.len(), 1);
    let error = &report.failures[0].error;
    assert!(
        matches!(error, DeliveryError::Payload { category: "org_update", message_id, .. } if *message_id == bad)
    );
    let text = error_chain(error);
    assert!(
        text.contains(&bad.to_string())
            && text.contains("org_update")
            && text.contains("invalid type"),
        "{text}"
    );
    assert_eq!(pending_ids(&backend).await, [bad]);
}

/// A database without the outbox migrations gives a typed error naming the fix, on the relay
/// and on the write path; applying them (twice: it is idempotent) makes both work.
pub async fn missing_migration_is_a_typed_error<B: TestBackend>() {
    let backend = B::create_unmigrated().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("unmigrated"));

    let error = relay
        .drain()
        .await
        .expect_err("an unmigrated database is refused");
    assert!(matches!(error, Error::MigrationMissing { .. }), "{error:?}");
    let advice = error.to_string();
    assert!(
        advice.contains("migrate(&pool)") && advice.contains("migrator()"),
        "it advises what a user of the crates has: {advice}"
    );
    assert!(
        !advice.contains("xtask"),
        "not this repository's tools: {advice}"
    );
    let error = backend
        .store()
        .check_schema()
        .await
        .expect_err("the schema check fails");
    assert!(matches!(error, Error::MigrationMissing { .. }));

    let error = backend
        .write_in_transaction(1, &[note::<OrgUpdate>(1, 1, 1)], true)
        .await
        .expect_err("writing without the tables fails");
    assert!(matches!(error, Error::MigrationMissing { .. }), "{error:?}");

    backend.migrate().await.expect("migrate");
    backend.migrate().await.expect("migrating again is a no-op");
    backend
        .store()
        .check_schema()
        .await
        .expect("the schema is complete");
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    let fresh = Relay::with_config(backend.store(), recorder.registry(), config("migrated"));
    fresh.drain().await.expect("drain");
    assert_eq!(recorder.triples(), [("org_update", 1, 1)]);
}
