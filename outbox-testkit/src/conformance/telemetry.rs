//! SPEC §10: what a scenario reports, as metrics (exact counts and labels), spans and events;
//! and, with the `opentelemetry` feature, the producer's trace carried to the handler.
//!
//! Each test runs in [`capture`], on a runtime of one thread with the recorders installed for
//! it alone: these tests are plain functions, not `async fn`s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use outbox_core::telemetry::{
    DEAD_LETTERED, DEAD_LETTERS, DELIVERIES, DELIVERY_LAG, DRAIN_ROWS, HANDLER_DURATION,
    HANDLER_FAILURES, MESSAGES_WRITTEN, OLDEST_PENDING_AGE, PENDING_MESSAGES, ROWS_ACKNOWLEDGED,
    ROWS_COALESCED, SHARDS,
};
use outbox_core::{Admin, BoxError, Delivery, Relay, ShardKey};
use tracing::Level;

use super::{config, pending, write};
use crate::backend::StoreBackend;
use crate::fixtures::{AuditEvent, OrgAlert, OrgUpdate, Recorder, UserUpdate, note};
use crate::telemetry::{Probe, Telemetry, capture};

const ORG_UPDATE: [(&str, &str); 2] = [("category", "org_update"), ("scope", "organization")];
const AUDIT_EVENT: [(&str, &str); 2] = [("category", "audit_event"), ("scope", "organization")];
const USER_UPDATE: [(&str, &str); 2] = [("category", "user_update"), ("scope", "user")];
const ORG_ALERT: [(&str, &str); 2] = [("category", "org_alert"), ("scope", "organization")];

/// Five writes, one of them by a handler during its delivery (S13), and a group of two
/// (S11): the counters, histograms and spans they give, exactly.
pub fn telemetry_counts_writes_deliveries_and_coalescing<B: StoreBackend>() {
    let (delivered, telemetry) = capture(|_| async {
        let backend = Arc::new(B::create().await);
        let recorder = Recorder::new();
        let wrote = Arc::new(AtomicBool::new(false));
        let during_delivery = {
            let (backend, recorder, wrote) =
                (Arc::clone(&backend), recorder.clone(), Arc::clone(&wrote));
            move |delivery: Delivery<OrgUpdate>| {
                recorder.record(&delivery);
                let (backend, wrote) = (Arc::clone(&backend), Arc::clone(&wrote));
                async move {
                    if !wrote.swap(true, Ordering::SeqCst) {
                        write(&*backend, &[note::<OrgUpdate>(1, 1, 5)]).await;
                    }
                    Ok::<_, BoxError>(())
                }
            }
        };
        let registry = recorder.registry_with::<OrgUpdate>(during_delivery);
        write(
            &*backend,
            &[
                note::<OrgUpdate>(1, 1, 1),
                note::<OrgUpdate>(1, 1, 2),
                note::<AuditEvent>(1, 2, 3),
                note::<UserUpdate>(7, 3, 4),
            ],
        )
        .await;
        let relay = Relay::with_config(backend.store(), registry, config("telemetry"));
        relay.drain().await.expect("drain");
        assert!(pending(&*backend).await.is_empty(), "everything delivered");
        recorder.triples()
    });
    // Shards drain concurrently: their deliveries interleave in any order.
    let organization: Vec<_> = delivered
        .iter()
        .filter(|(category, ..)| *category != "user_update")
        .collect();
    assert_eq!(
        organization,
        [
            &("org_update", 1, 2),
            &("audit_event", 2, 3),
            &("org_update", 1, 5)
        ],
        "the group of two delivered once, the row written during its delivery after it"
    );
    assert!(delivered.contains(&("user_update", 3, 4)));

    assert_eq!(telemetry.counter(MESSAGES_WRITTEN, &ORG_UPDATE), 3);
    assert_eq!(telemetry.counter(MESSAGES_WRITTEN, &AUDIT_EVENT), 1);
    assert_eq!(telemetry.counter(MESSAGES_WRITTEN, &USER_UPDATE), 1);
    assert_eq!(telemetry.counter(DELIVERIES, &ORG_UPDATE), 2);
    assert_eq!(telemetry.counter(DELIVERIES, &AUDIT_EVENT), 1);
    assert_eq!(telemetry.counter(DELIVERIES, &USER_UPDATE), 1);
    assert_eq!(
        telemetry.counter(ROWS_COALESCED, &ORG_UPDATE),
        1,
        "the group's older row"
    );
    assert_eq!(telemetry.counter(ROWS_COALESCED, &AUDIT_EVENT), 0);
    let org = [("scope", "organization")];
    let user = [("scope", "user")];
    assert_eq!(telemetry.counter(ROWS_ACKNOWLEDGED, &org), 4);
    assert_eq!(telemetry.counter(ROWS_ACKNOWLEDGED, &user), 1);
    assert_eq!(
        telemetry.histogram(DRAIN_ROWS, &org).iter().sum::<f64>(),
        4.0,
        "the drains' rows add up to the rows acknowledged"
    );
    for (labels, calls) in [(ORG_UPDATE, 2), (AUDIT_EVENT, 1), (USER_UPDATE, 1)] {
        assert_eq!(telemetry.histogram(HANDLER_DURATION, &labels).len(), calls);
        let lags = telemetry.histogram(DELIVERY_LAG, &labels);
        assert_eq!(lags.len(), calls);
        assert!(lags.iter().all(|lag| (0.0..60.0).contains(lag)), "{lags:?}");
    }
    assert_bounded_labels(&telemetry);
    assert!(
        !telemetry
            .metric_keys()
            .iter()
            .any(|(_, name, _)| name == HANDLER_FAILURES),
        "no failure reported"
    );

    let written: usize = telemetry
        .spans("outbox.write")
        .iter()
        .map(|span| {
            span.field("messages")
                .map_or(1, |n| n.parse().expect("a count"))
        })
        .sum();
    assert_eq!(written, 5, "each write in a span");

    let deliveries = telemetry.spans("outbox.deliver");
    assert_eq!(deliveries.len(), 4, "{deliveries:#?}");
    let first = deliveries
        .iter()
        .find(|span| span.field("category") == Some("org_update"))
        .expect("the group's delivery");
    assert_eq!(first.field("category"), Some("org_update"));
    assert_eq!(first.field("object"), Some("1"));
    assert_eq!(first.field("attempt"), Some("1"));
    assert_eq!(first.field("rows"), Some("2"));
    assert!(first.field("message_id").is_some() && first.field("fencing_token").is_some());
    assert_eq!(
        first.field("shard").map(|shard| shard.contains('1')),
        Some(true)
    );
    assert!(
        deliveries
            .iter()
            .all(|span| span.parents.first() == Some(&"outbox.drain_shard")),
        "each delivery inside its shard's drain: {deliveries:#?}"
    );
    let successes: Vec<_> = telemetry
        .events()
        .into_iter()
        .filter(|event| event.message == "delivered")
        .collect();
    assert_eq!(successes.len(), 4);
    assert!(
        successes
            .iter()
            .all(|event| event.level == Level::DEBUG && event.spans[0] == "outbox.deliver")
    );
}

/// A failing handler: its failures by kind, the span and warning of each attempt with the
/// error's chain, its group dead-lettered at its category's max_attempts; the gauges read
/// before and after.
pub fn telemetry_reports_failures_dead_letters_and_gauges<B: StoreBackend>() {
    let (gauges, telemetry) = capture(|probe| async move {
        let backend = B::create().await;
        let registry = Recorder::new().registry_with::<OrgAlert>(|_: Delivery<OrgAlert>| async {
            Err::<(), BoxError>("the pager is unreachable".into())
        });
        let store = backend.store();
        let relay = Relay::with_config(store.clone(), registry, config("telemetry-failure"));
        write(
            &backend,
            &[note::<OrgAlert>(1, 1, 1), note::<OrgUpdate>(2, 1, 2)],
        )
        .await;

        relay.refresh_gauges().await.expect("gauges");
        let before = Gauges::read(&probe);
        relay.drain().await.expect("first drain");
        relay.refresh_gauges().await.expect("gauges");
        let after_failure = Gauges::read(&probe);
        assert!(
            store
                .reschedule(&ShardKey::local(outbox_core::ScopeId(1), 1))
                .await
                .expect("reschedule"),
            "the shard was backing off"
        );
        relay.drain().await.expect("second drain");
        relay.refresh_gauges().await.expect("gauges");
        [before, after_failure, Gauges::read(&probe)]
    });
    let failures = [
        ("category", "org_alert"),
        ("scope", "organization"),
        ("kind", "handler"),
    ];
    assert_eq!(telemetry.counter(HANDLER_FAILURES, &failures), 2);
    assert_eq!(telemetry.counter(DELIVERIES, &ORG_ALERT), 0);
    assert_eq!(telemetry.counter(DEAD_LETTERED, &ORG_ALERT), 1);
    assert_eq!(telemetry.histogram(HANDLER_DURATION, &ORG_ALERT).len(), 2);
    assert_eq!(telemetry.counter(DELIVERIES, &ORG_UPDATE), 1);

    let attempts: Vec<_> = telemetry
        .spans("outbox.deliver")
        .into_iter()
        .filter(|span| span.field("category") == Some("org_alert"))
        .map(|span| span.field("attempt").map(str::to_owned))
        .collect();
    assert_eq!(attempts, [Some("1".to_owned()), Some("2".to_owned())]);
    let warnings: Vec<_> = telemetry
        .events()
        .into_iter()
        .filter(|event| event.message == "delivery failed")
        .collect();
    assert_eq!(warnings.len(), 2, "one warning per failed attempt");
    for warning in &warnings {
        assert_eq!(warning.level, Level::WARN);
        assert_eq!(warning.spans[0], "outbox.deliver");
        assert_eq!(warning.field("kind"), Some("handler"));
        let error = warning.field("error").unwrap_or_default();
        assert!(
            error.contains("org_alert") && error.contains("the pager is unreachable"),
            "the error's chain: {error}"
        );
    }

    let [before, after_failure, after_dead_letter] = gauges;
    assert_eq!(before.pending, 2.0);
    assert_eq!(before.due, 2.0);
    assert!((0.0..60.0).contains(&before.oldest_age), "{before:?}");
    assert_eq!(after_failure.pending, 1.0);
    assert_eq!((after_failure.due, after_failure.backoff), (0.0, 1.0));
    assert_eq!(after_failure.dead_letters, 0.0);
    assert_eq!(after_dead_letter.pending, 0.0);
    assert_eq!(after_dead_letter.oldest_age, 0.0);
    assert_eq!(after_dead_letter.backoff, 0.0);
    assert_eq!(after_dead_letter.dead_letters, 1.0);
    assert_bounded_labels(&telemetry);
}

/// The gauges at one moment, as the recorder holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Gauges {
    pending: f64,
    oldest_age: f64,
    due: f64,
    backoff: f64,
    dead_letters: f64,
}

impl Gauges {
    /// The gauges as last set.
    fn read(probe: &Probe) -> Self {
        let gauge = |name, labels: &[(&str, &str)]| {
            probe
                .gauge(name, labels)
                .unwrap_or_else(|| panic!("gauge {name} {labels:?} set"))
        };
        let shards = |state| gauge(SHARDS, &[("state", state)]);
        Self {
            pending: gauge(PENDING_MESSAGES, &[]),
            oldest_age: gauge(OLDEST_PENDING_AGE, &[]),
            due: shards("due"),
            backoff: shards("backoff"),
            dead_letters: gauge(DEAD_LETTERS, &[]),
        }
    }
}

/// No metric carries an identifier in a label: only names, kinds and states.
fn assert_bounded_labels(telemetry: &Telemetry) {
    for (_, name, labels) in telemetry.metric_keys() {
        for (key, _) in &labels {
            assert!(
                ["category", "scope", "kind", "state", "operation"].contains(&key.as_str()),
                "{name} has an unbounded label {key}"
            );
        }
    }
}
