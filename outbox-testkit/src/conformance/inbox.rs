//! The consumer's half (S10b): an [`Inbox`] records each message in the consumer's own
//! transaction, and a [`Consumer`] applies a broker's messages through it, effectively once:
//! retried in place, dead-lettered after its limit, left to the broker when stopped.
//!
//! The messages are real envelopes: written to the outbox, published by the relay to a
//! [`MemorySink`], and handed to the consumer as a broker would hand them over.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use outbox_core::handler::{Handler, HandlerContext};
use outbox_core::inbox::{
    Consumer, ConsumerProblem, Inbox, InboxDatabase, Incoming, Received, Settled,
};
use outbox_core::sink::headers;
use outbox_core::{Backoff, BoxError, Delivery, Registry, Relay, State};

use super::{config, int, write};
use crate::TestBackend;
use crate::fixtures::{AuditEvent, Note, OrgUpdate, note, org_shard};
use crate::sink::MemorySink;

/// What a test handler saw: each call's message seq and attempt.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<(u64, u32)>>>);

impl Calls {
    fn seen(&self) -> Vec<(u64, u32)> {
        self.0.lock().expect("calls").clone()
    }
}

/// A handler inserting business row `10_000 + seq` in the consumer's transaction, then
/// failing on its first `fail_first` attempts (every attempt if `u32::MAX`).
struct Applies<B> {
    calls: Calls,
    fail_first: u32,
    backend: PhantomData<fn() -> B>,
}

impl<B> Applies<B> {
    fn new(calls: &Calls, fail_first: u32) -> Self {
        Self {
            calls: calls.clone(),
            fail_first,
            backend: PhantomData,
        }
    }
}

impl<B: TestBackend> Handler<Delivery<AuditEvent>> for Applies<B> {
    async fn call(
        &self,
        delivery: Delivery<AuditEvent>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let seq = delivery.payload.seq;
        self.calls
            .0
            .lock()
            .expect("calls")
            .push((seq, delivery.attempt));
        B::insert_business_row_in(cx, business_row(seq)).await?;
        if delivery.attempt <= self.fail_first {
            return Err(format!("charging order {seq} failed").into());
        }
        Ok(())
    }
}

fn business_row(seq: u64) -> i64 {
    10_000 + i64::try_from(seq).expect("a small seq")
}

/// A quick backoff: a test waits milliseconds between attempts.
fn quick() -> Backoff {
    Backoff::new(Duration::from_millis(1), Duration::from_millis(5)).with_jitter(false)
}

/// The envelopes of audit events `seqs` of organization 7 (object = seq), as a broker would
/// hand them to a consumer: written, relayed to a [`MemorySink`], published.
async fn published<B: TestBackend>(backend: &B, seqs: &[u64]) -> Vec<Incoming> {
    let messages: Vec<_> = seqs
        .iter()
        .map(|&seq| note::<AuditEvent>(7, seq, seq).with_metadata("tenant", "acme"))
        .collect();
    write(backend, &messages).await;
    let sink = MemorySink::new();
    let registry = Registry::builder()
        .sink::<AuditEvent, _>(sink.clone())
        .build()
        .expect("a registry");
    Relay::with_config(backend.store(), registry, config("producer"))
        .drain()
        .await
        .expect("drain");
    let published: Vec<Incoming> = sink.published().iter().map(Incoming::from).collect();
    assert_eq!(published.len(), seqs.len(), "each message published");
    published
}

/// Settles `incoming` with no stop and no keep-alive.
async fn settle(consumer: &Consumer, incoming: &Incoming) -> Settled {
    consumer
        .process(incoming, || async {}, std::future::pending())
        .await
        .expect("settled: nothing stops it")
}

/// A consumer "billing" on `backend`'s store with `handler` for the audit events.
fn billing<B: TestBackend>(backend: &B, handler: Applies<B>) -> outbox_core::inbox::ConsumerBuilder
where
    B::Store: InboxDatabase,
{
    Consumer::builder(Inbox::new("billing"), backend.store())
        .handle::<AuditEvent, _>(handler)
        .backoff(quick())
}

/// A message is recorded once per consumer, in the consumer's own transaction: `First`, then
/// `Duplicate` once that transaction committed; the record of a rolled-back transaction goes
/// with it.
pub async fn the_inbox_records_each_message_once_per_consumer<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let store = backend.store();
    let billing = Inbox::new("billing");
    let id = outbox_core::MessageId(41);
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        billing.receive(tx.as_mut(), id).await.expect("receive"),
        Received::First
    );
    drop(tx); // rolled back
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        billing.receive(tx.as_mut(), id).await.expect("receive"),
        Received::First,
        "the rolled-back record is gone"
    );
    tx.commit().await.expect("commit");
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        billing.receive(tx.as_mut(), id).await.expect("receive"),
        Received::Duplicate
    );
    assert_eq!(
        Inbox::new("search")
            .receive(tx.as_mut(), id)
            .await
            .expect("receive"),
        Received::First,
        "each consumer has an inbox of its own"
    );
    tx.commit().await.expect("commit");
}

/// A consumer decodes each message into the producer's `Delivery<C>` (shard, object,
/// payload, id, creation time, metadata), applies it with its effect in one transaction,
/// and finds a redelivery applied.
pub async fn a_consumer_applies_each_message_once_with_its_effect<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let incoming = published(&backend, &[1, 2, 3]).await;
    let calls = Calls::default();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = billing(&backend, Applies::<B>::new(&calls, 0))
        .build()
        .expect("a consumer");
    let observer = {
        let seen = Arc::clone(&seen);
        Consumer::builder(Inbox::new("audit-log"), backend.store())
            .handle::<AuditEvent, _>(move |delivery: Delivery<AuditEvent>| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().expect("seen").push(delivery);
                    Ok::<_, BoxError>(())
                }
            })
            .build()
            .expect("a consumer")
    };

    for message in &incoming {
        assert_eq!(settle(&consumer, message).await, Settled::Applied);
        assert_eq!(settle(&observer, message).await, Settled::Applied);
    }
    for message in &incoming {
        let mut again = message.clone();
        again.delivered = 2;
        assert_eq!(settle(&consumer, &again).await, Settled::Duplicate);
    }
    assert_eq!(calls.seen(), vec![(1, 1), (2, 1), (3, 1)]);
    for seq in 1..=3 {
        assert!(backend.business_row_exists(business_row(seq)).await);
    }

    let seen = seen.lock().expect("seen");
    for (delivery, message) in seen.iter().zip(&incoming) {
        assert_eq!(
            delivery.message_id.0.to_string(),
            message.header(headers::MESSAGE_ID).expect("an id")
        );
        assert_eq!(delivery.shard, org_shard(7));
        assert_eq!(
            int(delivery.object_identifier),
            i64::try_from(delivery.payload.seq).expect("seq")
        );
        assert_eq!(delivery.payload, Note::new(delivery.payload.seq));
        assert_eq!(delivery.metadata.get("tenant"), Some("acme"));
        assert_eq!(delivery.fencing_token, 0);
        let age = SystemTime::now()
            .duration_since(delivery.created_at)
            .expect("created in the past");
        assert!(age < Duration::from_secs(60), "created {age:?} ago");
    }
}

/// A handler that fails is retried in place, each failed attempt's effect rolled back with
/// its record; the attempt counts the broker's deliveries; the broker is kept alive while
/// the consumer waits.
pub async fn a_failing_handler_is_retried_in_place_and_its_effect_rolled_back<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let incoming = published(&backend, &[1, 2]).await;
    let calls = Calls::default();
    let consumer = billing(&backend, Applies::<B>::new(&calls, 2))
        .build()
        .expect("a consumer");
    let keep_alives = AtomicU32::new(0);
    let keep_alive = || {
        keep_alives.fetch_add(1, Ordering::Relaxed);
        async {}
    };
    let settled = consumer
        .process(&incoming[0], keep_alive, std::future::pending())
        .await;
    assert_eq!(settled, Some(Settled::Applied));
    assert_eq!(calls.seen(), vec![(1, 1), (1, 2), (1, 3)]);
    assert_eq!(
        keep_alives.load(Ordering::Relaxed),
        2,
        "kept alive at each wait"
    );
    assert!(
        backend.business_row_exists(business_row(1)).await,
        "applied once: the failed attempts' rows rolled back"
    );

    let mut redelivered = incoming[1].clone();
    redelivered.delivered = 3;
    assert_eq!(settle(&consumer, &redelivered).await, Settled::Applied);
    assert_eq!(
        calls.seen()[3..],
        [(2, 3)],
        "the broker's third delivery is attempt 3"
    );
}

/// A message whose handler fails on its last allowed attempt is a dead letter: recorded with
/// its error and attempts, its effect rolled back, its record kept so that the broker's next
/// delivery is a duplicate.
pub async fn a_message_failing_its_last_attempt_is_a_dead_letter<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let incoming = published(&backend, &[1]).await;
    let calls = Calls::default();
    let consumer = billing(&backend, Applies::<B>::new(&calls, u32::MAX))
        .max_attempts(3)
        .build()
        .expect("a consumer");
    assert_eq!(settle(&consumer, &incoming[0]).await, Settled::DeadLettered);
    assert_eq!(calls.seen(), vec![(1, 1), (1, 2), (1, 3)]);
    assert!(!backend.business_row_exists(business_row(1)).await);

    let letters = backend
        .store()
        .dead_letters(Some("billing"), 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.consumer, "billing");
    assert_eq!(
        letter.message_id.map(|id| id.0.to_string()).as_deref(),
        incoming[0].header(headers::MESSAGE_ID)
    );
    assert_eq!(letter.category.as_deref(), Some("audit_event"));
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.error.contains("charging order 1 failed"),
        "{}",
        letter.error
    );
    assert_eq!(letter.payload, incoming[0].payload);
    let headers: serde_json::Value = serde_json::from_str(&letter.headers).expect("JSON headers");
    assert_eq!(headers["tenant"], "acme");

    assert_eq!(settle(&consumer, &incoming[0]).await, Settled::Duplicate);
    assert_eq!(calls.seen().len(), 3, "a dead letter is not applied again");
    assert!(
        backend
            .store()
            .dead_letters(Some("search"), 10)
            .await
            .expect("dead letters")
            .is_empty(),
        "listed by consumer"
    );
}

/// A message that cannot be decoded (a payload that is not the category's, a category no
/// handler takes, no message id) is a dead letter at once: no handler runs, nothing is
/// retried.
pub async fn undecodable_messages_are_dead_letters_at_once<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let incoming = published(&backend, &[1, 2, 3]).await;
    let calls = Calls::default();
    let consumer = billing(&backend, Applies::<B>::new(&calls, 0))
        .build()
        .expect("a consumer");

    let mut malformed = incoming[0].clone();
    malformed.payload = br#"{"seq": "one"}"#.to_vec();
    let mut unknown = incoming[1].clone();
    for (name, value) in &mut unknown.headers {
        if name == headers::CATEGORY {
            *value = "refund_issued".to_owned();
        }
    }
    let mut anonymous = incoming[2].clone();
    anonymous
        .headers
        .retain(|(name, _)| name != headers::MESSAGE_ID);

    for message in [&malformed, &unknown, &anonymous] {
        assert_eq!(settle(&consumer, message).await, Settled::DeadLettered);
    }
    assert!(calls.seen().is_empty(), "no handler ran");
    let letters = backend
        .store()
        .dead_letters(None, 10)
        .await
        .expect("dead letters");
    let errors: Vec<_> = letters.iter().map(|letter| letter.error.as_str()).collect();
    assert_eq!(letters.len(), 3, "{errors:?}");
    assert!(errors[0].contains("does not deserialize"), "{}", errors[0]);
    assert!(errors[1].contains("refund_issued"), "{}", errors[1]);
    assert!(errors[2].contains(headers::MESSAGE_ID), "{}", errors[2]);
    assert_eq!(letters[2].message_id, None);
    assert!(letters.iter().all(|letter| letter.attempts <= 1));

    assert_eq!(
        settle(&consumer, &malformed).await,
        Settled::Duplicate,
        "a dead letter with an id is recorded in the inbox"
    );
}

/// A consumer asked to stop while it waits to retry returns without settling: nothing is
/// recorded, and the broker's next delivery is applied.
pub async fn a_stopped_consumer_leaves_the_message_to_the_broker<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let incoming = published(&backend, &[1]).await;
    let calls = Calls::default();
    let stubborn = billing(&backend, Applies::<B>::new(&calls, u32::MAX))
        .backoff(Backoff::new(
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        ))
        .build()
        .expect("a consumer");
    let waiting = tokio::sync::Notify::new();
    let keep_alive = || {
        waiting.notify_one();
        async {}
    };
    let settled = stubborn
        .process(&incoming[0], keep_alive, waiting.notified())
        .await;
    assert_eq!(settled, None, "stopped while waiting to retry");
    assert_eq!(calls.seen(), vec![(1, 1)]);

    let fixed = billing(&backend, Applies::<B>::new(&calls, 0))
        .build()
        .expect("a consumer");
    let mut again = incoming[0].clone();
    again.delivered = 2;
    assert_eq!(settle(&fixed, &again).await, Settled::Applied);
    assert!(backend.business_row_exists(business_row(1)).await);
}

/// A consumer with a retention purges its own inbox records as it goes, and only its own; a
/// message delivered after its record is gone is applied again (the documented window).
pub async fn a_consumers_retention_purges_its_own_records<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let store = backend.store();
    let mut tx = store.begin().await.expect("begin");
    let search = Inbox::new("search");
    let kept = outbox_core::MessageId(999);
    assert_eq!(
        search.receive(tx.as_mut(), kept).await.expect("receive"),
        Received::First
    );
    tx.commit().await.expect("commit");

    let incoming = published(&backend, &[1]).await;
    let seen = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&seen);
    let forgetful = Consumer::builder(Inbox::new("billing"), backend.store())
        .handle::<AuditEvent, _>(move |_: Delivery<AuditEvent>| {
            counter.fetch_add(1, Ordering::Relaxed);
            async {
                // The record (SQLite's clock counts milliseconds) is older than a zero
                // window once its transaction commits.
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, BoxError>(())
            }
        })
        .retention(Duration::ZERO)
        .build()
        .expect("a consumer");
    assert_eq!(settle(&forgetful, &incoming[0]).await, Settled::Applied);
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        search.receive(tx.as_mut(), kept).await.expect("receive"),
        Received::Duplicate,
        "another consumer's records are kept"
    );
    drop(tx);
    assert_eq!(
        store
            .purge_inbox(Some("billing"), Duration::from_secs(3600))
            .await
            .expect("purge"),
        0,
        "billing's record was purged by its consumer"
    );
    assert_eq!(
        store
            .purge_inbox(None, Duration::ZERO)
            .await
            .expect("purge"),
        1,
        "search's"
    );
    assert_eq!(seen.load(Ordering::Relaxed), 1);
}

/// A consumer is refused when it is built wrong: no handler, a category handled twice, a
/// state a handler takes that nobody gave.
pub async fn a_consumer_built_wrong_is_refused_with_each_problem<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    let backend = B::create().await;
    let none = Consumer::builder(Inbox::new("billing"), backend.store())
        .build()
        .expect_err("no handler");
    assert!(matches!(none.0[..], [ConsumerProblem::NoHandler(ref name)] if name == "billing"));

    let needs_state =
        outbox_core::handler::handler_fn(|_: Delivery<OrgUpdate>, _: State<Arc<String>>| async {
            Ok::<_, BoxError>(())
        });
    let error = Consumer::builder(Inbox::new("billing"), backend.store())
        .handle::<OrgUpdate, _>(needs_state)
        .handle::<OrgUpdate, _>(|_: Delivery<OrgUpdate>| async { Ok::<_, BoxError>(()) })
        .build()
        .expect_err("two problems");
    assert!(
        error
            .0
            .iter()
            .any(|problem| matches!(problem, ConsumerProblem::HandledTwice("org_update"))),
        "{error}"
    );
    assert!(
        error.0.iter().any(|problem| matches!(
            problem,
            ConsumerProblem::MissingState {
                category: "org_update",
                ..
            }
        )),
        "{error}"
    );
    assert!(error.to_string().contains("State<"), "{error}");
}

/// The consumer's span (`outbox.consume`) is linked to the producer's span (with the
/// `opentelemetry` feature): the message written inside a request's span, relayed through a
/// sink, is applied by a handler running in a span of a trace of its own, linked to the
/// request's.
#[cfg(feature = "opentelemetry")]
pub fn the_consumers_span_is_linked_to_the_producers<B: TestBackend>()
where
    B::Store: InboxDatabase,
{
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let (exporter, provider, subscriber) = super::telemetry::spans_in_memory();
    let exported = exporter.clone();
    let ((producer, handler), _) = crate::telemetry::capture_with(subscriber, |_| async move {
        let backend = B::create().await;
        let request = tracing::info_span!("request");
        let (message, producer) = {
            let _entered = request.enter();
            let message = note::<AuditEvent>(7, 1, 1);
            (message, request.context().span().span_context().clone())
        };
        write(&backend, &[message]).await;
        let sink = MemorySink::new();
        let registry = Registry::builder()
            .sink::<AuditEvent, _>(sink.clone())
            .build()
            .expect("a registry");
        Relay::with_config(backend.store(), registry, config("producer"))
            .drain()
            .await
            .expect("drain");
        let incoming = Incoming::from(&sink.published()[0]);
        let seen = Arc::new(Mutex::new(None));
        let consumer = {
            let seen = Arc::clone(&seen);
            Consumer::builder(Inbox::new("billing"), backend.store())
                .handle::<AuditEvent, _>(move |_: Delivery<AuditEvent>| {
                    let current = tracing::Span::current()
                        .context()
                        .span()
                        .span_context()
                        .clone();
                    *seen.lock().expect("seen") = Some(current);
                    async { Ok::<_, BoxError>(()) }
                })
                .build()
                .expect("a consumer")
        };
        assert_eq!(settle(&consumer, &incoming).await, Settled::Applied);
        let handler = seen.lock().expect("seen").clone().expect("the handler ran");
        // The span ends when its last handle goes: a database driver's worker thread may
        // hold one a moment after the statement it ran in the span returned.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !exported
            .get_finished_spans()
            .expect("the finished spans")
            .iter()
            .any(|span| span.name == "outbox.consume")
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (producer, handler)
    });
    assert!(producer.is_valid(), "the producer's span has a trace");
    provider.force_flush().expect("flush the spans");
    let spans = exporter.get_finished_spans().expect("the finished spans");
    let consume = spans
        .iter()
        .find(|span| span.name == "outbox.consume")
        .unwrap_or_else(|| {
            let names: Vec<_> = spans.iter().map(|span| span.name.clone()).collect();
            panic!("the consumer's span, among {names:?}")
        });
    assert_eq!(
        consume.span_context.span_id(),
        handler.span_id(),
        "the handler runs in it"
    );
    assert_ne!(
        handler.trace_id(),
        producer.trace_id(),
        "a trace of its own"
    );
    assert!(
        consume
            .links
            .iter()
            .any(|link| link.span_context.trace_id() == producer.trace_id()
                && link.span_context.span_id() == producer.span_id()),
        "linked to the producer's span: {:?}",
        consume.links
    );
}
