//! Flush-after-commit and deferred writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::error::error_chain;
use outbox_core::relay::FlushError;
use outbox_core::store::Store;
use outbox_core::store::{ClaimOptions, HandlerMode};
use outbox_core::{BoxError, Delivery, Message, Relay, WrittenShards};

use super::{Gate, config, int, pending, pending_ids, state_of, write};
use crate::backend::{Scoped, StoreBackend, TestBackend};
use crate::fixtures::{AuditEvent, OrgUpdate, Recorder, note, org_shard};

/// The `(shard, object, seq)` of what a recorder saw.
fn seen(recorder: &Recorder) -> Vec<(i64, i64, u64)> {
    let mut seen: Vec<_> = recorder
        .seen()
        .into_iter()
        .map(|seen| (int(seen.shard.shard_identifier), int(seen.object), seen.seq))
        .collect();
    seen.sort_unstable();
    seen
}

/// After commit, a flush drains exactly the shards the transaction wrote to, including
/// their older pending rows; other shards are left to the relay.
pub async fn s02_flush_drains_exactly_the_shards_written<B: TestBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s02"));
    // Pending before the transaction: one in shard 1 (which it writes to), one in shard 2.
    write(
        &backend,
        &[note::<OrgUpdate>(1, 10, 1), note::<OrgUpdate>(2, 20, 2)],
    )
    .await;

    let written = backend
        .write_scoped(
            Scoped {
                top: &[note::<OrgUpdate>(1, 11, 3)],
                nested: &[note::<OrgUpdate>(3, 30, 4)],
                ..Scoped::default()
            },
            true,
        )
        .await
        .expect("write and commit");
    assert_eq!(
        written
            .iter()
            .map(|(shard, _)| shard.clone())
            .collect::<Vec<_>>(),
        [org_shard(1), org_shard(3)],
        "the top level's shard and the nested scope's"
    );

    let report = relay.flush(&written).await.expect("flush");
    assert_eq!(seen(&recorder), [(1, 10, 1), (1, 11, 3), (3, 30, 4)]);
    assert_eq!(report.deliveries, 3);
    let left: Vec<_> = pending(&backend)
        .await
        .into_iter()
        .map(|row| (row.shard, int(row.object_identifier)))
        .collect();
    assert_eq!(left, [(org_shard(2), 20)], "shard 2 is the relay's");
}

/// A flush is bounded to the rows that existed at commit: a row written to the same group
/// after the commit stays for the relay, and the flush delivers the committed payload.
pub async fn s02_flush_is_bounded_to_the_rows_at_commit<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s02-bound"));
    let written = committed(
        &backend,
        &[note::<OrgUpdate>(1, 10, 1), note::<AuditEvent>(1, 11, 2)],
    )
    .await;
    let later = write(
        &backend,
        &[note::<OrgUpdate>(1, 10, 3), note::<AuditEvent>(1, 12, 4)],
    )
    .await;

    relay.flush(&written).await.expect("flush");
    assert_eq!(seen(&recorder), [(1, 10, 1), (1, 11, 2)]);
    assert_eq!(
        pending_ids(&backend).await,
        later,
        "written after the commit"
    );
}

/// A handler failing during a flush is a typed error carrying the handler's message as
/// its cause; the data stays committed, the rows stay for the relay, and the shard's schedule
/// is not pushed back: the relay delivers at once.
pub async fn s02_failed_flush_is_typed_and_leaves_the_schedule<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let broken = Arc::new(AtomicBool::new(true));
    let handler = {
        let recorder = recorder.clone();
        let broken = Arc::clone(&broken);
        move |delivery: Delivery<OrgUpdate>| {
            let fail = broken.load(Ordering::SeqCst);
            if !fail {
                recorder.record(&delivery);
            }
            async move {
                if fail {
                    return Err::<(), BoxError>("the control silo is down".into());
                }
                Ok(())
            }
        }
    };
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(handler),
        config("s02-fail"),
    );
    let written = committed(
        &backend,
        &[note::<OrgUpdate>(1, 10, 1), note::<AuditEvent>(2, 20, 2)],
    )
    .await;

    let error = relay.flush(&written).await.expect_err("the handler fails");
    let FlushError::Delivery { shard, report, .. } = &error else {
        panic!("expected a delivery failure, got {error:?}");
    };
    assert_eq!(*shard, org_shard(1));
    assert_eq!(report.deliveries, 1, "the other shard was flushed");
    let chain = error_chain(&error);
    assert!(
        chain.contains("flushing the outboxes of scope 1 shard 1 failed")
            && chain.contains("handler for category `org_update` failed")
            && chain.contains("the control silo is down"),
        "{chain}"
    );
    assert_eq!(pending(&backend).await.len(), 1, "the failed row stays");
    let state = state_of(&backend.store(), &org_shard(1)).await;
    assert!(
        state
            .as_ref()
            .is_none_or(|state| state.attempts == 0 && state.retry_at.is_none()),
        "a flush does not back the shard off: {state:?}"
    );

    broken.store(false, Ordering::SeqCst);
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.deliveries, 1, "due at once");
    assert!(pending(&backend).await.is_empty());
}

/// A deferred scope inside a flushing transaction defers its own writes to the
/// relay; a nested scope rolled back leaves no rows and nothing to flush; a transaction rolled
/// back writes nothing and flushes nothing.
pub async fn s03_deferred_scopes_and_rollbacks_flush_nothing<B: TestBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s03"));

    let written = backend
        .write_scoped(
            Scoped {
                top: &[note::<OrgUpdate>(1, 10, 1)],
                deferred: &[note::<OrgUpdate>(2, 20, 2)],
                rolled_back: &[note::<OrgUpdate>(3, 30, 3)],
                ..Scoped::default()
            },
            true,
        )
        .await
        .expect("write and commit");
    assert_eq!(
        written
            .iter()
            .map(|(shard, _)| shard.clone())
            .collect::<Vec<_>>(),
        [org_shard(1)]
    );
    relay.flush(&written).await.expect("flush");
    assert_eq!(seen(&recorder), [(1, 10, 1)]);
    let left: Vec<_> = pending(&backend)
        .await
        .into_iter()
        .map(|row| (row.shard, int(row.object_identifier)))
        .collect();
    assert_eq!(
        left,
        [(org_shard(2), 20)],
        "deferred, and nothing of the rollback"
    );

    let written = backend
        .write_scoped(
            Scoped {
                top: &[note::<OrgUpdate>(4, 40, 4)],
                ..Scoped::default()
            },
            false,
        )
        .await
        .expect("write and roll back");
    assert_eq!(written, WrittenShards::new());
    let report = relay.flush(&written).await.expect("an empty flush");
    assert_eq!((report.shards_claimed, report.deliveries), (0, 0));
    assert_eq!(seen(&recorder), [(1, 10, 1)], "no handler call");
    assert_eq!(pending(&backend).await.len(), 1);
}

/// What a runner repeats: one pass over the due shards, up to the newest row when the pass
/// begins; rows handlers write meanwhile (into the same shard too) wait for the next pass.
pub async fn flush_due_leaves_cascades_for_the_next_pass<B: StoreBackend>() {
    let backend = Arc::new(B::create().await);
    let recorder = Recorder::new();
    let cascade = {
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
                if seq < 3 {
                    write(
                        &*backend,
                        &[note::<OrgUpdate>(shard, int(object) + 1, seq + 1)],
                    )
                    .await;
                }
                Ok::<(), BoxError>(())
            }
        }
    };
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(cascade),
        config("flush-due"),
    );
    write(&*backend, &[note::<OrgUpdate>(1, 10, 1)]).await;
    let mut deliveries = Vec::new();
    loop {
        let report = relay.flush_due().await.expect("a pass");
        if report.deliveries == 0 {
            break;
        }
        deliveries.push(report.deliveries);
    }
    assert_eq!(deliveries, [1, 1, 1], "one cascade step per pass");
    assert_eq!(seen(&recorder), [(1, 10, 1), (1, 11, 2), (1, 12, 3)]);
    assert!(pending(&*backend).await.is_empty());
}

/// Writes `messages` with the flushing transaction and commits: what the commit gives to flush.
pub(crate) async fn committed<B: StoreBackend>(backend: &B, messages: &[Message]) -> WrittenShards {
    backend.commit(messages).await.expect("write and commit")
}

/// A flush whose shard another flush holds (its handler slow) waits for it, then delivers
/// its own rows: `Ok` means delivered, never "someone else has the shard".
pub async fn s02_flush_waits_for_a_shard_another_flush_holds<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let (gate, mut inside) = Gate::new();
    let relay = Relay::with_config(
        backend.store(),
        recorder.registry_with::<OrgUpdate>(gate.recording(&recorder)),
        config("s02-held"),
    );
    let first = committed(&backend, &[note::<OrgUpdate>(1, 10, 1)]).await;
    let first_flush = tokio::spawn({
        let relay = relay.clone();
        async move { relay.flush(&first).await }
    });
    inside
        .recv()
        .await
        .expect("the first flush is in its handler");

    let second = committed(&backend, &[note::<OrgUpdate>(1, 11, 2)]).await;
    let second_flush = tokio::spawn({
        let relay = relay.clone();
        async move { relay.flush(&second).await }
    });
    gate.open();
    let report = second_flush
        .await
        .expect("second flush task")
        .expect("the second flush waits for the shard, then delivers");
    assert!(
        seen(&recorder).contains(&(1, 11, 2)),
        "when the second flush returns Ok, its row is delivered: {:?} ({report:?})",
        seen(&recorder)
    );
    first_flush
        .await
        .expect("first flush task")
        .expect("first flush");
    assert_eq!(seen(&recorder), [(1, 10, 1), (1, 11, 2)]);
    assert!(pending(&backend).await.is_empty());
}

/// A shard held past [`RelayConfig::flush_wait`](outbox_core::RelayConfig) is a typed
/// error naming the shard and how many of the transaction's rows remain; they stay pending.
pub async fn s02_flush_gives_up_on_a_held_shard_with_a_typed_error<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = config("s02-give-up")
        .to_builder()
        .flush_wait(Duration::from_millis(300))
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), recorder.registry(), config);
    let holder = backend
        .store()
        .claim(
            &org_shard(1),
            &ClaimOptions {
                worker: "stuck".to_owned(),
                lease: Duration::from_secs(60),
                mode: HandlerMode::Leased,
            },
        )
        .await
        .expect("claim")
        .expect("another worker holds shard 1");
    let written = committed(
        &backend,
        &[note::<OrgUpdate>(1, 10, 1), note::<AuditEvent>(1, 11, 2)],
    )
    .await;

    let error = relay
        .flush(&written)
        .await
        .expect_err("the shard stays held");
    let FlushError::Incomplete { remaining, report } = &error else {
        panic!("expected an incomplete flush, got {error:?}");
    };
    assert_eq!(remaining.len(), 1);
    assert_eq!(remaining[0].shard, org_shard(1));
    assert_eq!(remaining[0].messages, 2);
    assert!(remaining[0].waited >= Duration::from_millis(300));
    assert_eq!(report.deliveries, 0);
    assert!(
        error
            .to_string()
            .contains("2 message(s) in scope 1 shard 1"),
        "{error}"
    );
    assert_eq!(pending(&backend).await.len(), 2, "nothing is lost");
    assert!(recorder.seen().is_empty());
    drop(holder);
}

/// Budgets: a flush delivers every row its transaction wrote however many there are
/// (the relay's row budget does not cut it short); the relay's own drain yields at the
/// budget and says so in its report; and a shard emptied exactly as its budget ran out keeps
/// no state row.
pub async fn s02_budgets_do_not_cut_a_flush_short<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let config = config("s02-budget")
        .to_builder()
        .shard_row_budget(10)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), recorder.registry(), config);
    let many: Vec<Message> = (0..25)
        .map(|seq| note::<AuditEvent>(1, seq, seq as u64))
        .collect();
    let written = committed(&backend, &many).await;
    let report = relay.flush(&written).await.expect("flush");
    assert_eq!(report.deliveries, 25, "every row, past the budget of 10");
    assert!(!report.rows_remain(), "{report:?}");
    assert!(pending(&backend).await.is_empty());

    // The relay's drain of one shard yields at its budget, and says so.
    let rows: Vec<Message> = (0..20)
        .map(|seq| note::<AuditEvent>(2, seq, seq as u64))
        .collect();
    write(&backend, &rows).await;
    let report = relay.drain_shards(&[org_shard(2)]).await.expect("drain");
    assert_eq!(report.deliveries, 10);
    assert_eq!(report.yielded, [org_shard(2)]);
    assert!(report.rows_remain());
    assert_eq!(pending(&backend).await.len(), 10);
    // The next drain empties the shard exactly as it spends its budget.
    let report = relay.drain_shards(&[org_shard(2)]).await.expect("drain");
    assert_eq!(report.deliveries, 10);
    assert!(pending(&backend).await.is_empty());
    assert_eq!(
        state_of(&backend.store(), &org_shard(2)).await,
        None,
        "an emptied shard keeps no state row"
    );
    assert!(
        backend
            .store()
            .shard_states()
            .await
            .expect("states")
            .is_empty()
    );
}
