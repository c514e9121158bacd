//! Delivery semantics and fan-out.

use std::sync::Arc;

use outbox_core::{BoxError, Delivery, Destination, Id, Message, Relay, Scope, ShardKey};

use super::{config, int, pending, write};
use crate::backend::StoreBackend;
use crate::fixtures::{
    AuditEvent, Note, OrgScope, OrgUpdate, ProjectUpdate, Recorder, UserUpdate, note, org_shard,
};

/// Within a shard, groups are delivered one at a time in the order of their oldest row,
/// each with its newest payload: A1, B1, A2 deliver A (A2), then B (B1).
pub async fn s10_groups_in_order_of_oldest_row_with_newest_payload<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s10"));

    write(&backend, &[note::<OrgUpdate>(1, 100, 1)]).await;
    write(&backend, &[note::<OrgUpdate>(1, 200, 2)]).await;
    write(&backend, &[note::<OrgUpdate>(1, 100, 3)]).await;

    let report = relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [("org_update", 100, 3), ("org_update", 200, 2)]
    );
    assert_eq!(report.deliveries, 2);
    assert_eq!(report.rows_acknowledged, 3);
    assert!(pending(&backend).await.is_empty());
}

/// A group's newest row is found even when it lies beyond the rows read at once, and the
/// order of groups is kept across reads.
pub async fn s10_coalescing_reaches_beyond_one_read<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = config("s10-batches")
        .to_builder()
        .batch_size(2)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), recorder.registry(), config);

    // A1 B1 C1 A2 D1 A3
    for (seq, object) in [(1, 1), (2, 2), (3, 3), (4, 1), (5, 4), (6, 1)] {
        write(&backend, &[note::<OrgUpdate>(1, object, seq)]).await;
    }
    let report = relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [
            ("org_update", 1, 6),
            ("org_update", 2, 2),
            ("org_update", 3, 3),
            ("org_update", 4, 5),
        ]
    );
    assert_eq!(report.rows_acknowledged, 6);
    assert!(pending(&backend).await.is_empty());
}

/// Two writes to one group, drained, are one handler call with the newer payload, and
/// both rows are deleted.
pub async fn s11_two_writes_to_one_group_are_one_call<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s11"));

    write(&backend, &[note::<ProjectUpdate>(9, 5, 1)]).await;
    write(&backend, &[note::<ProjectUpdate>(9, 5, 2)]).await;
    assert_eq!(pending(&backend).await.len(), 2);

    let report = relay.drain().await.expect("drain");
    assert_eq!(recorder.triples(), [("project_update", 5, 2)]);
    assert_eq!(report.deliveries, 1);
    assert_eq!(report.rows_acknowledged, 2);
    assert!(pending(&backend).await.is_empty());
}

/// The same object under two categories is two groups; the same group key in two shards
/// is one group per shard.
pub async fn s12_categories_and_shards_are_separate_groups<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s12"));

    write(
        &backend,
        &[
            note::<OrgUpdate>(1, 5, 1),
            note::<ProjectUpdate>(1, 5, 2),
            note::<OrgUpdate>(2, 5, 3),
            note::<OrgUpdate>(2, 5, 4),
        ],
    )
    .await;
    relay.drain().await.expect("drain");

    let in_shard = |shard| {
        recorder
            .in_shard(&org_shard(shard))
            .into_iter()
            .map(|seen| (seen.category, int(seen.object), seen.seq))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        in_shard(1),
        [("org_update", 5, 1), ("project_update", 5, 2)]
    );
    assert_eq!(in_shard(2), [("org_update", 5, 4)]);
    assert!(pending(&backend).await.is_empty());
}

/// A row written to a group while that group is being delivered is not acknowledged
/// with it: it survives and is delivered afterwards.
pub async fn s13_row_written_during_delivery_survives<B: StoreBackend>() {
    let backend = Arc::new(B::create().await);
    let recorder = Recorder::new();
    let handler = writing_once_during_delivery(&backend, &recorder, note::<OrgUpdate>(1, 1, 2));
    let registry = Recorder::new().registry_with::<OrgUpdate>(handler);
    let relay = Relay::with_config(backend.store(), registry, config("s13"));

    write(&*backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [("org_update", 1, 1), ("org_update", 1, 2)],
        "the row written during delivery was delivered after it"
    );
    assert!(pending(&*backend).await.is_empty());
}

/// A handler of `OrgUpdate` that records each delivery with `recorder` and, during the first,
/// writes `message`.
pub(crate) fn writing_once_during_delivery<B: StoreBackend>(
    backend: &Arc<B>,
    recorder: &Recorder,
    message: Message,
) -> impl outbox_core::handler::Handler<Delivery<OrgUpdate>> + use<B> {
    let (backend, recorder) = (Arc::clone(backend), recorder.clone());
    let pending = Arc::new(std::sync::Mutex::new(Some(message)));
    move |delivery: Delivery<OrgUpdate>| {
        recorder.record(&delivery);
        let backend = Arc::clone(&backend);
        let message = pending.lock().expect("not poisoned").take();
        async move {
            if let Some(message) = message {
                write(&*backend, &[message]).await;
            }
            Ok::<_, BoxError>(())
        }
    }
}

/// Messages of a non-coalescing category are each delivered, in write order within the
/// shard, interleaved with other groups in the order written.
pub async fn s14_non_coalescing_messages_in_write_order<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = config("s14")
        .to_builder()
        .batch_size(2)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), recorder.registry(), config);

    write(
        &backend,
        &[
            note::<AuditEvent>(1, 1, 1),
            note::<AuditEvent>(1, 1, 2),
            note::<OrgUpdate>(1, 9, 3),
            note::<AuditEvent>(1, 1, 4),
            note::<AuditEvent>(1, 2, 5),
        ],
    )
    .await;
    relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [
            ("audit_event", 1, 1),
            ("audit_event", 1, 2),
            ("org_update", 9, 3),
            ("audit_event", 1, 4),
            ("audit_event", 2, 5),
        ]
    );
    assert!(pending(&backend).await.is_empty());
}

/// Handlers that write new outboxes (into their own shard and others) are drained too.
pub async fn s24_handlers_cascade_into_new_outboxes<B: StoreBackend>() {
    let backend = Arc::new(B::create().await);
    let recorder = Recorder::new();
    let handler = {
        let (backend, recorder) = (Arc::clone(&backend), recorder.clone());
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let backend = Arc::clone(&backend);
            let (shard, object, seq) = (
                delivery.shard_identifier(),
                delivery.object_identifier,
                delivery.payload.seq,
            );
            async move {
                let cascade = [
                    note::<ProjectUpdate>(shard, object, seq + 100),
                    note::<UserUpdate>(50, object, seq + 200),
                ];
                write(&*backend, &cascade).await;
                Ok::<_, BoxError>(())
            }
        }
    };
    let registry = recorder.registry_with::<OrgUpdate>(handler);
    let relay = Relay::with_config(backend.store(), registry, config("s24"));

    write(&*backend, &[note::<OrgUpdate>(1, 7, 1)]).await;
    relay.drain().await.expect("one drain follows the cascade");
    let mut seen = recorder.triples();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            ("org_update", 7, 1),
            ("project_update", 7, 101),
            ("user_update", 7, 201)
        ]
    );
    assert!(pending(&*backend).await.is_empty());
}

/// Fan-out: one write becomes one row per destination, each its own shard with its own
/// handler call; a failing destination does not hold the others back.
pub async fn fan_out_destinations_drain_independently<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let handler = {
        let recorder = recorder.clone();
        move |delivery: Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let refuse = delivery.destination().map(Destination::as_str) == Some("eu");
            async move {
                if refuse {
                    return Err::<(), BoxError>("eu is down".into());
                }
                Ok(())
            }
        }
    };
    let registry = recorder.registry_with::<OrgUpdate>(handler);
    let relay = Relay::with_config(backend.store(), registry, config("fan-out"));
    let destinations = ["us", "eu", "ap"].map(|name| Destination::new(name).expect("valid"));

    let messages =
        Message::fan_out::<OrgUpdate>(destinations.clone(), 1, 1, &Note::new(1)).expect("fan out");
    assert_eq!(messages.len(), 3);
    write(&backend, &messages).await;

    let report = relay.drain().await.expect("drain");
    let mut reached: Vec<_> = recorder
        .seen()
        .into_iter()
        .map(|seen| {
            seen.shard
                .destination
                .expect("fan-out deliveries have a destination")
        })
        .collect();
    reached.sort();
    let mut expected = destinations.to_vec();
    expected.sort();
    assert_eq!(reached, expected, "each destination got its own call");
    assert_eq!(report.failures.len(), 1);
    assert_eq!(
        report.failures[0]
            .shard
            .destination
            .as_ref()
            .map(Destination::as_str),
        Some("eu")
    );
    let rows = pending(&backend).await;
    assert_eq!(rows.len(), 1, "only the failed destination's row is left");
    assert_eq!(
        rows[0].shard.destination.as_ref().map(Destination::as_str),
        Some("eu")
    );
}

/// Identifiers wider than an `i64` — a `u64` above `i64::MAX`, a UUID-sized `u128` — are
/// shards and objects of their own: never the integer with the same bits, the same value, or
/// `i64::MAX` (where PostgreSQL keeps a wide identifier's integer column). They coalesce,
/// order and read back like integers, written one by one or in one statement.
pub async fn wide_identifiers_are_shards_and_objects_of_their_own<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("wide"));
    let big = u64::MAX - 1;
    let uuid = Id::wide(0x0123_4567_89ab_4def_8123_4567_89ab_cdef);
    let small_wide = Id::wide(7);

    write(&backend, &[note::<OrgUpdate>(big, big, 1)]).await;
    write(
        &backend,
        &[
            note::<OrgUpdate>(small_wide, Id::wide(5), 2),
            note::<OrgUpdate>(small_wide, 5, 3),
            note::<OrgUpdate>(7, 5, 4),
            note::<OrgUpdate>(i64::MAX, 1, 5),
            note::<OrgUpdate>(uuid, uuid, 6),
        ],
    )
    .await;
    write(&backend, &[note::<OrgUpdate>(big, big, 7)]).await;
    write(&backend, &[note::<OrgUpdate>(small_wide, Id::wide(5), 8)]).await;
    write(&backend, &[note::<OrgUpdate>(-1_i64, big as i64, 9)]).await;
    let west = Destination::new("eu:west").expect("a destination");
    write(
        &backend,
        &[note::<OrgUpdate>(uuid, uuid, 10).with_destination(west.clone())],
    )
    .await;

    let stored: Vec<(Id, Id)> = pending(&backend)
        .await
        .iter()
        .map(|row| (row.shard.shard_identifier, row.object_identifier))
        .collect();
    assert_eq!(
        stored,
        [
            (Id::from(big), Id::from(big)),
            (small_wide, Id::wide(5)),
            (small_wide, Id::integer(5)),
            (Id::integer(7), Id::integer(5)),
            (Id::integer(i64::MAX), Id::integer(1)),
            (uuid, uuid),
            (Id::from(big), Id::from(big)),
            (small_wide, Id::wide(5)),
            (Id::integer(-1), Id::integer(-2)),
            (uuid, uuid),
        ],
        "each identifier reads back as written"
    );

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let in_shard = |shard: Id| -> Vec<(Id, u64)> {
        recorder
            .in_shard(&org_shard(shard))
            .into_iter()
            .map(|seen| (seen.object, seen.seq))
            .collect()
    };
    assert_eq!(in_shard(Id::from(big)), [(Id::from(big), 7)], "coalesced");
    assert_eq!(
        in_shard(small_wide),
        [(Id::wide(5), 8), (Id::integer(5), 3)],
        "a wide and an integer object of one value are two groups"
    );
    assert_eq!(in_shard(Id::integer(7)), [(Id::integer(5), 4)]);
    assert_eq!(in_shard(Id::integer(i64::MAX)), [(Id::integer(1), 5)]);
    assert_eq!(in_shard(uuid), [(uuid, 6)]);
    assert_eq!(in_shard(Id::integer(-1)), [(Id::integer(-2), 9)]);
    let fan_out = ShardKey::fan_out(OrgScope::ID, uuid, west);
    assert_eq!(
        recorder
            .in_shard(&fan_out)
            .iter()
            .map(|seen| (seen.object, seen.seq))
            .collect::<Vec<_>>(),
        [(uuid, 10)],
        "a wide shard's fan-out destination is a shard of its own"
    );
    assert_eq!(report.deliveries, 8);
    assert!(pending(&backend).await.is_empty());
}
