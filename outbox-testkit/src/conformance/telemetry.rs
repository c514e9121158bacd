//! SPEC §10: what a scenario reports, as metrics (exact counts and labels), spans and events;
//! and, with the `opentelemetry` feature, the producer's trace carried to the handler.
//!
//! Each test runs in [`capture`], on a runtime of one thread with the recorders installed for
//! it alone: these tests are plain functions, not `async fn`s.

use std::sync::Arc;

use outbox_core::admin::Admin;
use outbox_core::telemetry::{
    DATABASE_ERRORS, DEAD_LETTERED, DEAD_LETTERS, DELIVERIES, DELIVERY_LAG, DRAIN_ROWS,
    HANDLER_DURATION, HANDLER_FAILURES, HEAD_FAILURES, LEASE_LOSSES, MESSAGES_WRITTEN,
    OLDEST_PENDING_AGE, PENDING_MESSAGES, ROWS_ACKNOWLEDGED, ROWS_COALESCED, SHARDS,
};
use outbox_core::{BoxError, Category, Delivery, Relay, ShardKey};
use tracing::Level;

use super::delivery::writing_once_during_delivery;
use super::{config, pending, write};
use crate::backend::StoreBackend;
use crate::fixtures::{
    AuditEvent, FutureCategory, OrgAlert, OrgUpdate, Recorder, UserUpdate, note, org_shard,
};
use crate::telemetry::{Probe, Telemetry, capture};

const ORG_UPDATE: [(&str, &str); 2] = [("category", "org_update"), ("scope", "organization")];
const AUDIT_EVENT: [(&str, &str); 2] = [("category", "audit_event"), ("scope", "organization")];
const USER_UPDATE: [(&str, &str); 2] = [("category", "user_update"), ("scope", "user")];
const ORG_ALERT: [(&str, &str); 2] = [("category", "org_alert"), ("scope", "organization")];

/// Five writes, one of them by a handler during its delivery, and a group of two
///: the counters, histograms and spans they give, exactly.
pub fn telemetry_counts_writes_deliveries_and_coalescing<B: StoreBackend>() {
    let (delivered, telemetry) = capture(|_| async {
        let backend = Arc::new(B::create().await);
        let recorder = Recorder::new();
        let during_delivery =
            writing_once_during_delivery(&backend, &recorder, note::<OrgUpdate>(1, 1, 5));
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
            .any(|key| key.name == HANDLER_FAILURES),
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
        // A relay that starts reports its counters at 0: in a scrape before their first event.
        relay
            .run(std::future::ready(()))
            .await
            .expect("run, then stop");
        let registered = probe.metric_keys();
        for (name, labels) in [
            (LEASE_LOSSES, vec![("scope", "organization")]),
            (DEAD_LETTERED, ORG_ALERT.to_vec()),
            (DATABASE_ERRORS, vec![("operation", "discover")]),
        ] {
            assert!(
                registered.iter().any(|key| key.name == name
                    && key
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .eq(labels.iter().copied())),
                "{name} {labels:?} reported at 0 by a starting relay"
            );
            assert_eq!(probe.counter(name, &labels), 0);
        }

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

/// Heads that fail before any handler runs are counted by kind (an unknown category, a scope mismatch):
/// a message of a category this binary does not know parks its shard, counted once and
/// warned once however often the relay drains; a relay that knows the category says once, at
/// info, that it resumed the shard. A row whose scope is not its category's is counted too.
pub fn telemetry_counts_heads_that_fail_before_a_handler<B: StoreBackend>() {
    let ((), telemetry) = capture(|_| async move {
        let backend = B::create().await;
        let store = backend.store();
        backend
            .insert_raw(
                &org_shard(3),
                FutureCategory::ID.0,
                1.into(),
                r#"{"seq":1,"text":"future"}"#,
            )
            .await;
        // OrgUpdate belongs to the organization scope, not the user scope (2).
        backend
            .insert_raw(
                &ShardKey::local(outbox_core::ScopeId(2), 4),
                OrgUpdate::ID.0,
                1.into(),
                r#"{"seq":2,"text":"mismatched"}"#,
            )
            .await;
        let old = Relay::with_config(store.clone(), Recorder::new().registry(), config("old"));
        for _ in 0..3 {
            old.drain().await.expect("drain");
        }
        let recorder = Recorder::new();
        let new = Relay::with_config(
            store,
            recorder
                .builder()
                .handle::<FutureCategory>(recorder.handler())
                .build()
                .expect("registry"),
            config("new"),
        );
        new.drain().await.expect("drain");
        assert_eq!(recorder.seen().len(), 1, "the parked message was delivered");
    });
    let head = |scope, kind| telemetry.counter(HEAD_FAILURES, &[("scope", scope), ("kind", kind)]);
    assert_eq!(head("organization", "unknown_category"), 1, "parked once");
    assert!(
        head("user", "scope_mismatch") >= 1,
        "the mismatched row is counted"
    );
    let events = telemetry.events();
    let parked: Vec<_> = events
        .iter()
        .filter(|event| event.message.starts_with("shard parked"))
        .collect();
    assert_eq!(parked.len(), 1, "one warning when it parks");
    assert_eq!(parked[0].level, Level::WARN);
    let resumed: Vec<_> = events
        .iter()
        .filter(|event| event.message.starts_with("resumed shards parked"))
        .collect();
    assert_eq!(resumed.len(), 1, "one info when it resumes");
    assert_eq!(resumed[0].level, Level::INFO);
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
    for metric in telemetry.metric_keys() {
        let name = &metric.name;
        for (key, _) in &metric.labels {
            assert!(
                ["category", "scope", "kind", "state", "operation"].contains(&key.as_str()),
                "{name} has an unbounded label {key}"
            );
        }
    }
}

/// Spans exported to memory through OpenTelemetry: the exporter, its provider (flush it
/// before reading the exporter), and a `tracing` subscriber recording into them.
#[cfg(feature = "opentelemetry")]
pub(crate) fn spans_in_memory() -> (
    opentelemetry_sdk::trace::InMemorySpanExporter,
    opentelemetry_sdk::trace::SdkTracerProvider,
    impl tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
) {
    use opentelemetry::trace::TracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
    (exporter, provider, subscriber)
}

/// The producer's trace reaches the handler (SPEC §10, with the `opentelemetry` feature): the
/// W3C trace context of the span current at `Message::new` is stored with the message; the
/// delivery's span is linked to the producer's span (the default), or made its child
/// ([`TraceRelation::Child`](outbox_core::relay::TraceRelation::Child)); the handler reads the trace
/// id from [`Delivery::metadata`] either way.
#[cfg(feature = "opentelemetry")]
pub fn trace_context_reaches_the_handler<B: StoreBackend>() {
    use opentelemetry::trace::TraceContextExt;
    use outbox_core::RelayConfig;
    use outbox_core::relay::TraceRelation;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    for relation in [TraceRelation::Link, TraceRelation::Child] {
        let (exporter, provider, subscriber) = spans_in_memory();
        let ((producer, seen), _) = crate::telemetry::capture_with(subscriber, |_| async move {
            let backend = B::create().await;
            let request = tracing::info_span!("request");
            let (message, producer) = {
                let _entered = request.enter();
                let message = note::<OrgUpdate>(1, 1, 1);
                (message, request.context().span().span_context().clone())
            };
            write(&backend, &[message]).await;
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let handler = {
                let seen = Arc::clone(&seen);
                move |delivery: Delivery<OrgUpdate>| {
                    let current = tracing::Span::current()
                        .context()
                        .span()
                        .span_context()
                        .clone();
                    let written = delivery.metadata.trace_id().map(str::to_owned);
                    seen.lock().expect("not poisoned").push((written, current));
                    async { Ok::<_, BoxError>(()) }
                }
            };
            let config = RelayConfig::builder()
                .trace_relation(relation)
                .build()
                .expect("a valid relay configuration");
            let registry = Recorder::new().registry_with::<OrgUpdate>(handler);
            Relay::with_config(backend.store(), registry, config)
                .drain()
                .await
                .expect("drain");
            let seen = seen.lock().expect("not poisoned").clone();
            (producer, seen)
        });
        assert!(producer.is_valid(), "the producer's span has a trace");
        let producer_trace = producer.trace_id().to_string();
        let [(written, handler)] = <[_; 1]>::try_from(seen).expect("one delivery");
        assert_eq!(
            written.as_deref(),
            Some(producer_trace.as_str()),
            "{relation:?}: the trace id the producer wrote is the one the handler reads"
        );
        provider.force_flush().expect("flush the spans");
        let spans = exporter.get_finished_spans().expect("the finished spans");
        let delivery = spans
            .iter()
            .find(|span| span.name == "outbox.deliver")
            .expect("the delivery's span");
        assert_eq!(delivery.span_context.span_id(), handler.span_id());
        match relation {
            TraceRelation::Child => {
                assert_eq!(handler.trace_id(), producer.trace_id(), "one trace");
                assert_eq!(delivery.parent_span_id, producer.span_id());
            }
            _ => {
                assert_ne!(
                    handler.trace_id(),
                    producer.trace_id(),
                    "a trace of its own"
                );
                assert!(
                    delivery
                        .links
                        .iter()
                        .any(|link| link.span_context.trace_id() == producer.trace_id()
                            && link.span_context.span_id() == producer.span_id()),
                    "linked to the producer's span: {:?}",
                    delivery.links
                );
            }
        }
    }
}

/// A message's metadata and creation time reach its handler; a message written outside any
/// trace stores none (a `NULL`); a dead letter keeps its metadata and its replay writes it
/// back.
pub async fn metadata_and_creation_time_reach_the_handler<B: StoreBackend>() {
    use outbox_core::admin::DeadLetterFilter;
    use outbox_core::metadata::Metadata;

    let backend = B::create().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(
        Metadata,
        std::time::SystemTime,
    )>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |delivery: Delivery<OrgAlert>| {
            seen.lock()
                .expect("not poisoned")
                .push((delivery.metadata.clone(), delivery.created_at));
            async { Err::<(), BoxError>("refused".into()) }
        }
    };
    let store = backend.store();
    let relay = Relay::with_config(
        store.clone(),
        Recorder::new().registry_with::<OrgAlert>(handler),
        config("metadata"),
    );
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    write(
        &backend,
        &[
            note::<OrgAlert>(1, 1, 1).with_metadata("tenant", "acme"),
            note::<OrgUpdate>(2, 1, 2),
        ],
    )
    .await;
    let stored = |metadata: &Option<String>| {
        metadata
            .as_deref()
            .map(|json| Metadata::from_json(json).expect("a JSON object of strings"))
    };
    let tenant: Metadata = [("tenant", "acme")].into_iter().collect();
    let rows = pending(&backend).await;
    assert_eq!(
        rows.iter()
            .map(|row| stored(&row.metadata))
            .collect::<Vec<_>>(),
        [Some(tenant.clone()), None],
        "metadata stored as a JSON object, none as NULL"
    );

    let shard = ShardKey::local(outbox_core::ScopeId(1), 1);
    relay.drain().await.expect("first attempt");
    store.reschedule(&shard).await.expect("reschedule");
    relay.drain().await.expect("second attempt: dead-lettered");
    let deliveries = seen.lock().expect("not poisoned").clone();
    assert_eq!(deliveries.len(), 2);
    for (metadata, created_at) in &deliveries {
        assert_eq!(metadata.get("tenant"), Some("acme"));
        assert!(
            *created_at > before && *created_at < before + std::time::Duration::from_secs(120),
            "the creation time, by the database's clock"
        );
    }

    let letters = store
        .dead_letters(&DeadLetterFilter::all())
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(stored(&letters[0].metadata), Some(tenant.clone()));
    store
        .replay_dead_letters(&[letters[0].message_id])
        .await
        .expect("replay");
    let replayed = pending(&backend).await;
    assert_eq!(
        replayed
            .iter()
            .map(|row| stored(&row.metadata))
            .collect::<Vec<_>>(),
        [Some(tenant)],
        "the replay keeps the metadata"
    );
}

/// Metadata that does not read: a row whose metadata is not a JSON object of strings (written around the
/// typed API) is a precise failure of its shard, and the row is kept.
pub async fn malformed_metadata_is_a_precise_failure<B: crate::TestBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("metadata"));
    backend
        .execute(
            "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, category, \
                object_identifier, payload, metadata) \
             VALUES (1, 1, '', 1, 1, '{\"seq\": 1, \"text\": \"x\"}', '{\"attempt\": 1}')",
        )
        .await;
    write(&backend, &[note::<OrgUpdate>(2, 2, 2)]).await;
    let report = relay
        .drain()
        .await
        .expect("bad metadata does not fail the drain");
    assert_eq!(recorder.triples(), [("org_update", 2, 2)]);
    assert_eq!(report.failures.len(), 1);
    let error = &report.failures[0].error;
    assert!(
        matches!(
            error,
            outbox_core::DeliveryError::Metadata {
                category: "org_update",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.kind(), "metadata");
    let text = outbox_core::error::error_chain(error);
    assert!(
        text.contains("not a JSON object of strings") && text.contains("invalid type"),
        "{text}"
    );
    assert_eq!(pending(&backend).await.len(), 1, "the row is kept");
}
