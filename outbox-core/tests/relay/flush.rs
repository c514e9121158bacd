//! Flush after commit (S2) and the runner's pass.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::memory::MemoryStore;
use outbox_core::relay::FlushError;
use outbox_core::store::Store;
use outbox_core::store::{ClaimOptions, HandlerMode};
use outbox_core::{BoxError, Delivery, Message, WrittenShards};

use super::{Event, Recorder, Update, config, msg, relay, shard};

/// Writes `messages` at once, and what a commit of them would give to flush.
fn committed(store: &MemoryStore, messages: &[Message]) -> WrittenShards {
    let ids = store.write_all(messages);
    let mut written = WrittenShards::new();
    written.record_all(messages, &ids);
    written
}

/// A flush drains exactly the shards written, up to the rows written, past the relay's
/// budgets; other shards and later rows are left to the relay.
#[tokio::test]
async fn a_flush_delivers_exactly_what_was_written() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let config = config("flush")
        .to_builder()
        .shard_row_budget(5)
        .batch_size(4)
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, recorder.registry(), config);
    store.write(&msg::<Update>(2, 1, 0));
    let many: Vec<_> = (1..=12).map(|seq| msg::<Event>(1, 1, seq)).collect();
    let written = committed(&store, &many);
    let later = store.write(&msg::<Event>(1, 1, 13));

    let report = relay.flush(&written).await.expect("flush");
    assert_eq!(
        report.deliveries, 12,
        "every row written, past the budget of 5"
    );
    assert!(!report.rows_remain(), "{report:?}");
    let left: Vec<_> = store
        .pending_messages(10)
        .await
        .unwrap()
        .iter()
        .map(|m| (i64::try_from(m.shard.shard_identifier).unwrap(), m.id))
        .collect();
    assert_eq!(left.len(), 2);
    assert!(left.contains(&(1, later)), "written after the commit");
    assert_eq!(left[0].0, 2, "another shard is the relay's");
}

/// A handler failing in a flush is a typed error; the shard is not backed off.
#[tokio::test]
async fn a_failed_flush_is_typed_and_leaves_the_schedule() {
    let store = MemoryStore::new();
    let broken = Arc::new(AtomicBool::new(true));
    let handler = {
        let broken = Arc::clone(&broken);
        move |_: Delivery<Update>| {
            let fail = broken.load(Ordering::SeqCst);
            async move {
                if fail {
                    return Err::<(), BoxError>("down".into());
                }
                Ok(())
            }
        }
    };
    let relay = relay(
        &store,
        Recorder::default().registry_with(handler),
        config("flush-fail"),
    );
    let written = committed(&store, &[msg::<Update>(1, 1, 1)]);
    let error = relay.flush(&written).await.expect_err("the handler fails");
    assert!(
        matches!(&error, FlushError::Delivery { shard: s, .. } if *s == shard(1)),
        "{error:?}"
    );
    let states = store.shard_states().await.unwrap();
    assert!(
        states
            .iter()
            .all(|state| state.attempts == 0 && state.retry_at.is_none()),
        "a flush does not back off: {states:?}"
    );
    broken.store(false, Ordering::SeqCst);
    assert_eq!(relay.drain().await.unwrap().deliveries, 1, "due at once");
}

/// A flush waits for a shard another worker holds, up to `flush_wait`, then says what is
/// left.
#[tokio::test]
async fn a_flush_gives_up_on_a_held_shard_with_a_typed_error() {
    let store = MemoryStore::new();
    let config = config("flush-held")
        .to_builder()
        .flush_wait(Duration::from_millis(50))
        .build()
        .expect("a valid relay configuration");
    let relay = relay(&store, Recorder::default().registry(), config);
    let options = ClaimOptions {
        worker: "holder".into(),
        lease: Duration::from_secs(60),
        mode: HandlerMode::Leased,
    };
    let _held = store
        .claim(&shard(1), &options)
        .await
        .unwrap()
        .expect("held");
    let written = committed(&store, &[msg::<Update>(1, 1, 1), msg::<Event>(1, 2, 2)]);
    let error = relay.flush(&written).await.expect_err("held");
    let FlushError::Incomplete { remaining, .. } = &error else {
        panic!("expected an incomplete flush, got {error:?}");
    };
    assert_eq!(
        (remaining[0].shard.clone(), remaining[0].messages),
        (shard(1), 2)
    );
    assert!(remaining[0].waited >= Duration::from_millis(50));
}

/// `flush_due`: one pass up to the newest row at its start; what handlers write meanwhile
/// waits for the next pass.
#[tokio::test]
async fn flush_due_leaves_cascades_for_the_next_pass() {
    let store = MemoryStore::new();
    let recorder = Recorder::default();
    let cascade = {
        let (store, recorder) = (store.clone(), recorder.clone());
        move |delivery: Delivery<Update>| {
            recorder.record(&delivery);
            if delivery.payload < 3 {
                store.write(&msg::<Update>(
                    1,
                    i64::try_from(delivery.object_identifier).unwrap() + 1,
                    delivery.payload + 1,
                ));
            }
            async { Ok::<(), BoxError>(()) }
        }
    };
    let relay = relay(&store, recorder.registry_with(cascade), config("flush-due"));
    store.write(&msg::<Update>(1, 1, 1));
    let mut passes = Vec::new();
    loop {
        let report = relay.flush_due().await.expect("a pass");
        if report.deliveries == 0 {
            break;
        }
        passes.push(report.deliveries);
    }
    assert_eq!(passes, [1, 1, 1]);
    assert_eq!(recorder.triples(), [(1, 1, 1), (1, 2, 2), (1, 3, 3)]);
}
