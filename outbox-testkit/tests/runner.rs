//! `outbox_runner` itself: it must deliver what the code wrote, and it must not hide a failure.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{BoxError, Delivery, Message, Registry, Relay, RelayConfig};

use outbox_core::admin::Admin;

use outbox_core::error::error_chain;

use outbox_core::relay::FlushError;
use outbox_sqlite::SqliteStore;
use outbox_testkit::fixtures::{OrgUpdate, note, org_shard};
use outbox_testkit::runner::MAX_ROUNDS;
use outbox_testkit::sqlite::SqliteTestDatabase;
use outbox_testkit::{RunnerError, outbox_runner};
use sqlx::SqlitePool;

/// Each delivery's `(shard, object, seq)`, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(i64, i64, u64)>>>);

impl Seen {
    fn push(&self, delivery: &Delivery<OrgUpdate>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((
            i64::try_from(delivery.shard_identifier()).expect("an integer shard"),
            i64::try_from(delivery.object_identifier).expect("an integer object"),
            delivery.payload.seq,
        ));
    }

    fn all(&self) -> Vec<(i64, i64, u64)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn database() -> SqliteTestDatabase {
    let database = SqliteTestDatabase::create().await;
    outbox_sqlite::migrate(database.pool())
        .await
        .expect("migrate");
    database
}

fn relay(pool: &SqlitePool, registry: Registry) -> Relay<SqliteStore> {
    Relay::with_config(
        SqliteStore::new(pool.clone()),
        registry,
        RelayConfig::default(),
    )
}

/// A relay whose `org_update` handler records, then writes `next(seq)` (if any) as a cascade.
fn cascading(
    pool: &SqlitePool,
    seen: &Seen,
    next: fn(u64) -> Option<Message>,
) -> Relay<SqliteStore> {
    let handler = {
        let (pool, seen) = (pool.clone(), seen.clone());
        move |delivery: Delivery<OrgUpdate>| {
            seen.push(&delivery);
            let (pool, cascade) = (pool.clone(), next(delivery.payload.seq));
            async move {
                if let Some(message) = cascade {
                    outbox_sqlite::write(&pool, &message).await?;
                }
                Ok::<(), BoxError>(())
            }
        }
    };
    relay(
        pool,
        Registry::builder()
            .handle::<OrgUpdate>(handler)
            .build()
            .expect("registry"),
    )
}

async fn pending(pool: &SqlitePool) -> usize {
    SqliteStore::new(pool.clone())
        .pending_messages(1000)
        .await
        .expect("pending")
        .len()
}

#[tokio::test]
async fn delivers_after_the_code_succeeds_and_follows_cascades() {
    let database = database().await;
    let pool = database.pool();
    let seen = Seen::default();
    // Each delivery below seq 3 cascades into the next object of the same shard.
    let relay = cascading(pool, &seen, |seq| {
        (seq < 3).then(|| note::<OrgUpdate>(1, 10 + seq as i64, seq + 1))
    });

    let value = outbox_runner(&relay, async {
        outbox_sqlite::write(pool, &note::<OrgUpdate>(1, 10, 1)).await?;
        Ok::<_, outbox_core::Error>("the code's value")
    })
    .await
    .expect("the runner delivers");
    assert_eq!(value, "the code's value");
    assert_eq!(seen.all(), [(1, 10, 1), (1, 11, 2), (1, 12, 3)]);
    assert_eq!(pending(pool).await, 0);
}

#[tokio::test]
async fn delivers_nothing_when_the_code_fails() {
    let database = database().await;
    let pool = database.pool();
    let seen = Seen::default();
    let relay = cascading(pool, &seen, |_| None);

    let error = outbox_runner(&relay, async {
        outbox_sqlite::write(pool, &note::<OrgUpdate>(1, 10, 1)).await?;
        Err::<(), BoxError>("the code under test gave up".into())
    })
    .await
    .expect_err("the code failed");
    assert!(matches!(error, RunnerError::Code(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "the code under test failed: the code under test gave up"
    );
    assert!(seen.all().is_empty(), "no handler ran");
    assert_eq!(
        pending(pool).await,
        1,
        "the committed row waits for the relay"
    );
}

#[tokio::test]
async fn a_cascade_that_never_ends_hits_the_recursion_limit() {
    let database = database().await;
    let pool = database.pool();
    let seen = Seen::default();
    let relay = cascading(pool, &seen, |seq| Some(note::<OrgUpdate>(1, 1, seq + 1)));

    let error = outbox_runner(&relay, async {
        outbox_sqlite::write(pool, &note::<OrgUpdate>(1, 1, 1)).await
    })
    .await
    .expect_err("the cascade never ends");
    let RunnerError::RecursionLimit { rounds, pending } = &error else {
        panic!("expected the recursion limit, got {error:?}");
    };
    assert_eq!(*rounds, MAX_ROUNDS);
    assert_eq!(seen.all().len(), MAX_ROUNDS, "one delivery per round");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload_value()["seq"], 11);
    let text = error.to_string();
    assert!(
        text.contains("after 10 rounds") && text.contains("category 1 object 1 in scope 1 shard 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_failing_handler_is_a_typed_flush_error_with_its_cause() {
    let database = database().await;
    let pool = database.pool();
    let calls = Arc::new(AtomicUsize::new(0));
    let registry = Registry::builder()
        .handle::<OrgUpdate>({
            let calls = Arc::clone(&calls);
            move |_: Delivery<OrgUpdate>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), BoxError>("the control silo refused the update".into()) }
            }
        })
        .build()
        .expect("registry");
    let relay = relay(pool, registry);

    let error = outbox_runner(&relay, async {
        outbox_sqlite::write(pool, &note::<OrgUpdate>(1, 10, 1)).await
    })
    .await
    .expect_err("the handler fails");
    let RunnerError::Flush(FlushError::Delivery {
        shard,
        error: cause,
        ..
    }) = &error
    else {
        panic!("expected a flush error, got {error:?}");
    };
    assert_eq!(*shard, org_shard(1));
    assert!(
        cause
            .to_string()
            .contains("handler for category `org_update` failed on message"),
        "{cause}"
    );
    let chain = error_chain(&error);
    assert!(
        chain.starts_with("delivering the outboxes the code wrote failed: flushing the outboxes of scope 1 shard 1 failed")
            && chain.ends_with("the control silo refused the update"),
        "{chain}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one round: a failure ends the run"
    );
    assert_eq!(pending(pool).await, 1, "the row stays for the relay");
}

#[tokio::test]
async fn shards_in_backoff_are_left_alone() {
    let database = database().await;
    let pool = database.pool();
    let seen = Seen::default();
    let failing = Arc::new(AtomicUsize::new(1));
    let registry = Registry::builder()
        .handle::<OrgUpdate>({
            let (seen, failing) = (seen.clone(), Arc::clone(&failing));
            move |delivery: Delivery<OrgUpdate>| {
                let fail = failing.load(Ordering::SeqCst) > 0;
                if !fail {
                    seen.push(&delivery);
                }
                async move {
                    if fail {
                        return Err::<(), BoxError>("down".into());
                    }
                    Ok(())
                }
            }
        })
        .build()
        .expect("registry");
    let relay = relay(pool, registry);
    // Shard 1 fails once through the relay: it backs off (2 s, the default) with its row.
    outbox_sqlite::write(pool, &note::<OrgUpdate>(1, 10, 1))
        .await
        .expect("write");
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1);
    failing.store(0, Ordering::SeqCst);

    outbox_runner(&relay, async {
        outbox_sqlite::write(pool, &note::<OrgUpdate>(2, 20, 2)).await
    })
    .await
    .expect("the runner delivers shard 2");
    assert_eq!(seen.all(), [(2, 20, 2)], "shard 1 is scheduled for later");
    assert_eq!(pending(pool).await, 1);
}
