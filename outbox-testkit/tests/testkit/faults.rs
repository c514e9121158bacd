//! `outbox_testkit::faults`: each fault is injected exactly where it should be, no more and
//! no less, and the relay sees it as the failure it stands for.

use std::time::{Duration, Instant};

use outbox_core::{DeliveryError, Destination, Id, ModelBatch, Registry};

use outbox_core::error::error_chain;
use outbox_testkit::faults::{Fault, Faulty, InjectedFault, Succeed};
use outbox_testkit::fixtures::{Member, Note, OrgUpdate, Project, note, org_shard};
use outbox_testkit::inspect::{Pending, assert_no_pending, assert_one_pending};
use outbox_testkit::recorder::{ModelRecording, Recording};

use super::Db;

/// The injected fault behind a relay's report of a failed handler.
fn injected(error: &DeliveryError) -> &InjectedFault {
    match error {
        DeliveryError::Handler { source, .. } => source
            .downcast_ref::<InjectedFault>()
            .unwrap_or_else(|| panic!("not an injected fault: {}", error_chain(error))),
        other => panic!("not a handler failure: {}", error_chain(other)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_times_fails_exactly_n_calls_then_delegates() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let faulty = Faulty::fail_times(2, recording.clone());
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    let shard = org_shard(3);
    db.write(&[note::<OrgUpdate>(3, 7, 1)]).await;

    let report = relay.drain().await.unwrap();
    assert_eq!(report.failures.len(), 1);
    let fault = injected(&report.failures[0].error);
    assert_eq!(
        (
            fault.fault,
            fault.number,
            fault.times,
            fault.call,
            fault.attempt
        ),
        (Fault::Fail, 1, Some(2), 1, 1)
    );
    assert_eq!(
        error_chain(&report.failures[0].error),
        format!(
            "handler for category `org_update` failed on message 1: injected failure 1 of 2 \
             on call 1 (delivery attempt 1 of object 7 in {shard})"
        )
    );
    assert!(
        recording.is_empty(),
        "a failed call does not reach the handler"
    );
    assert_one_pending::<OrgUpdate>(&db.store, 3, 7).await;

    let report = db.retry(&relay, &shard).await;
    let fault = injected(&report.failures[0].error);
    assert_eq!((fault.number, fault.call, fault.attempt), (2, 2, 2));
    assert!(recording.is_empty());

    let report = db.retry(&relay, &shard).await;
    assert!(report.is_clean(), "{report:?}");
    let seen = recording.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].object_identifier, seen[0].attempt),
        (Id::integer(7), 3)
    );
    assert_eq!(seen[0].payload, Note::new(1));
    assert_no_pending(&db.store).await;
    assert_eq!((faulty.calls(), faulty.injected()), (3, 2));

    // Once the n failures are spent, every call is delegated.
    db.write(&[note::<OrgUpdate>(3, 8, 2)]).await;
    assert!(relay.drain().await.unwrap().is_clean());
    assert_eq!(recording.objects(), [7, 8]);
    assert_eq!((faulty.calls(), faulty.injected()), (4, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_always_fails_every_call_and_the_shard_records_it() {
    let db = Db::new().await;
    let faulty = Faulty::fail_always();
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    let shard = org_shard(1);
    db.write(&[note::<OrgUpdate>(1, 5, 1)]).await;

    let mut report = relay.drain().await.unwrap();
    for call in 1..=3 {
        assert_eq!(report.failures.len(), 1, "call {call}");
        let fault = injected(&report.failures[0].error);
        assert_eq!((fault.number, fault.times, fault.call), (call, None, call));
        assert!(
            fault.to_string().starts_with(&format!(
                "injected failure on call {call}, failing every call"
            )),
            "{fault}"
        );
        if call < 3 {
            report = db.retry(&relay, &shard).await;
        }
    }
    assert_eq!((faulty.calls(), faulty.injected()), (3, 3));
    let pending = Pending::of(&db.store).await;
    assert_eq!(pending.len(), 1, "nothing is lost");
    let state = &pending.failing_shards()[0];
    assert_eq!((&state.shard, state.attempts), (&shard, 3));
    assert!(
        state
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("injected failure on call 3")),
        "{state:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_times_panics_n_calls_then_delegates() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let faulty = Faulty::panic_times(1, recording.clone());
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    db.write(&[note::<OrgUpdate>(2, 9, 1)]).await;

    let report = relay.drain().await.unwrap();
    match &report.failures[0].error {
        DeliveryError::Panicked {
            panic, category, ..
        } => {
            assert_eq!(*category, "org_update");
            assert_eq!(
                panic,
                "injected panic 1 of 1 on call 1 (delivery attempt 1 of object 9 in scope 1 shard 2)"
            );
        }
        other => panic!("expected a panic, got {}", error_chain(other)),
    }
    assert!(recording.is_empty());

    let report = db.retry(&relay, &org_shard(2)).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(recording.objects(), [9]);
    assert_eq!((faulty.calls(), faulty.injected()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_always_panics_every_call() {
    let db = Db::new().await;
    let faulty = Faulty::panic_always();
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    db.write(&[note::<OrgUpdate>(1, 1, 1)]).await;
    for call in 1..=2 {
        let report = if call == 1 {
            relay.drain().await.unwrap()
        } else {
            db.retry(&relay, &org_shard(1)).await
        };
        assert!(
            matches!(&report.failures[0].error, DeliveryError::Panicked { panic, .. }
                if panic.starts_with(&format!("injected panic on call {call}, failing every call"))),
            "{}",
            error_chain(&report.failures[0].error)
        );
    }
    assert_eq!((faulty.calls(), faulty.injected()), (2, 2));
    assert_eq!(Pending::of(&db.store).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_delays_each_call_then_delegates() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let delay = Duration::from_millis(300);
    let faulty = Faulty::sleep(delay, recording.clone());
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    db.write(&[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(1, 2, 2)])
        .await;

    let started = Instant::now();
    let report = relay.drain().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(
        started.elapsed() >= delay * 2,
        "two calls in one shard sleep one after the other: {:?}",
        started.elapsed()
    );
    assert_eq!(recording.objects(), [1, 2]);
    assert_eq!((faulty.calls(), faulty.injected()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_times_outlasts_the_handler_timeout_then_delegates_at_once() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let faulty = Faulty::sleep_times(1, Duration::from_secs(30), recording.clone());
    let relay = db.relay_with(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
        |config| config.handler_timeout(Some(Duration::from_millis(100))),
    );
    db.write(&[note::<OrgUpdate>(1, 1, 1)]).await;

    let report = relay.drain().await.unwrap();
    assert!(
        matches!(
            &report.failures[0].error,
            DeliveryError::TimedOut { timeout, .. } if *timeout == Duration::from_millis(100)
        ),
        "{}",
        error_chain(&report.failures[0].error)
    );
    assert!(recording.is_empty());

    let report = db.retry(&relay, &org_shard(1)).await;
    assert!(
        report.is_clean(),
        "the second call does not sleep: {report:?}"
    );
    assert_eq!(recording.objects(), [1]);
    assert_eq!((faulty.calls(), faulty.injected()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_object_injects_only_into_that_object() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let faulty = Faulty::fail_times(1, recording.clone()).for_object(2);
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    db.write(&[
        note::<OrgUpdate>(1, 1, 1),
        note::<OrgUpdate>(1, 2, 2),
        note::<OrgUpdate>(1, 3, 3),
        note::<OrgUpdate>(2, 4, 4),
    ])
    .await;

    let report = relay.drain().await.unwrap();
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].shard, org_shard(1));
    assert_eq!(injected(&report.failures[0].error).object_identifier, 2);
    let mut delivered = recording.objects();
    delivered.sort_unstable();
    assert_eq!(delivered, [1, 4], "other objects are not faulted");
    assert_eq!((faulty.calls(), faulty.injected()), (3, 1));

    db.retry(&relay, &org_shard(1)).await;
    assert_eq!(recording.in_shard(&org_shard(1)).len(), 3);
    assert_eq!((faulty.calls(), faulty.injected()), (5, 1));
    assert_no_pending(&db.store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_combines_predicates() {
    let db = Db::new().await;
    let faulty = Faulty::fail_always()
        .when(|call| call.shard.shard_identifier == 1)
        .when(|call| call.object_identifier > 1);
    let relay = db.relay(
        Registry::builder()
            .handle::<OrgUpdate>(faulty.clone())
            .build()
            .unwrap(),
    );
    db.write(&[
        note::<OrgUpdate>(1, 1, 1),
        note::<OrgUpdate>(1, 2, 2),
        note::<OrgUpdate>(2, 3, 3),
    ])
    .await;
    let report = relay.drain().await.unwrap();
    assert_eq!(report.failures.len(), 1);
    assert_eq!(injected(&report.failures[0].error).object_identifier, 2);
    assert_eq!((faulty.calls(), faulty.injected()), (3, 1));
}

/// Clones share their counters, and counting is exact with many shards drained at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_shared_and_exact_across_concurrent_shards() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let faulty = Faulty::fail_times(10, recording.clone());
    let registered = faulty.clone();
    let relay = db.relay_with(
        Registry::builder()
            .handle::<OrgUpdate>(registered)
            .build()
            .unwrap(),
        |config| config.max_concurrent_shards(8),
    );
    let messages: Vec<_> = (1..=50)
        .map(|shard| note::<OrgUpdate>(shard, shard, 1))
        .collect();
    db.write(&messages).await;

    let report = relay.drain().await.unwrap();
    assert_eq!(report.failures.len(), 10, "exactly n calls fail");
    let mut numbers: Vec<u32> = report
        .failures
        .iter()
        .map(|failure| injected(&failure.error).number)
        .collect();
    numbers.sort_unstable();
    assert_eq!(
        numbers,
        (1..=10).collect::<Vec<_>>(),
        "each failure numbered once"
    );
    assert_eq!(recording.len(), 40);
    assert_eq!((faulty.calls(), faulty.injected()), (50, 10));
    assert_eq!(Pending::of(&db.store).await.len(), 10);
}

/// A `Faulty` is a replication and a deletion handler of a replicated model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_apply_to_replication_and_deletion_handlers() {
    let db = Db::new().await;
    let recording = ModelRecording::<Project>::new();
    let faulty = Faulty::fail_times(1, recording.clone());
    let relay = db.relay(
        Registry::builder()
            .replication::<Project>(faulty.clone())
            .deletion::<Project>(faulty.clone())
            .build()
            .unwrap(),
    );
    let project = Project::new(11, 4, "api");
    let mut tx = db.database.pool().begin().await.unwrap();
    outbox_sqlite::insert(&mut tx, ModelBatch::local(&project))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let report = relay.drain().await.unwrap();
    let fault = injected(&report.failures[0].error);
    assert_eq!((fault.object_identifier, fault.call), (Id::integer(11), 1));
    assert!(
        error_chain(&report.failures[0].error).starts_with("handler for category `project` failed"),
    );
    assert!(recording.is_empty());
    db.retry(&relay, &org_shard(4)).await;
    assert_eq!(recording.replicated(), std::slice::from_ref(&project));

    let mut tx = db.database.pool().begin().await.unwrap();
    outbox_sqlite::delete(&mut tx, ModelBatch::local(&project))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(relay.drain().await.unwrap().is_clean());
    assert_eq!(recording.deleted(), [11]);
    assert_eq!((faulty.calls(), faulty.injected()), (3, 1));
}

/// A standalone fault handler needs no handler to wrap, for any kind of handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_faults_serve_fan_out_models() {
    let db = Db::new().await;
    let faulty = Faulty::fail_times(1, Succeed)
        .when(|call| call.shard.destination.as_ref().map(Destination::as_str) == Some("eu"));
    let relay = db.relay(
        Registry::builder()
            .replication::<Member>(faulty.clone())
            .deletion::<Member>(faulty.clone())
            .build()
            .unwrap(),
    );
    let member = Member {
        member_id: 1,
        org: 5,
        email: "a@example.com".into(),
    };
    let destinations = ["eu", "us"].map(|name| Destination::new(name).unwrap());
    let mut tx = db.database.pool().begin().await.unwrap();
    outbox_sqlite::insert(&mut tx, ModelBatch::to(&member, destinations.clone()))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let report = relay.drain().await.unwrap();
    assert_eq!(report.failures.len(), 1);
    let eu = report.failures[0].shard.clone();
    assert_eq!(eu.destination, Some(destinations[0].clone()));
    assert_eq!(Pending::of(&db.store).await.len(), 1, "us was delivered");
    db.retry(&relay, &eu).await;
    assert_no_pending(&db.store).await;
    assert_eq!((faulty.calls(), faulty.injected()), (3, 1));
}
