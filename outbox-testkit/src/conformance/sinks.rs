//! Sinks: publishing deliveries to a broker (here [`MemorySink`]), and riding out its outages
//! behind its breaker.

use std::time::Duration;

use outbox_core::admin::{Admin, Heartbeat, RelayInfo};
use outbox_core::metadata::TRACEPARENT;
use outbox_core::sink::{Publisher, Sink, headers};
use outbox_core::store::Store;
use outbox_core::telemetry::{BREAKER_OPEN, BREAKER_OPENINGS};
use outbox_core::{BoxError, Delivery, Registry, RelayConfig};

use super::relay::{run_until_stopped, stopped};
use super::{config, eventually, pending_ids, state_of, write};
use crate::backend::StoreBackend;
use crate::fixtures::{
    AuditEvent, Note, OrgAlert, OrgUpdate, ProjectUpdate, Recorder, UserUpdate, note, org_shard,
};
use crate::sink::MemorySink;

/// A registry publishing the organization updates, audit events and alerts to `sink`; the
/// other test categories are recorded.
fn publishing(sink: &MemorySink) -> Registry {
    let recorder = Recorder::new();
    Registry::builder()
        .sink::<OrgUpdate, _>(sink.clone())
        .sink::<AuditEvent, _>(sink.clone())
        .sink::<OrgAlert, _>(sink.clone())
        .handle::<ProjectUpdate>(recorder.handler())
        .handle::<UserUpdate>(recorder.handler())
        .build()
        .expect("the test categories do not conflict")
}

/// The (shard header, seq) of each envelope a sink confirmed, in order.
fn published(sink: &MemorySink) -> Vec<(String, u64)> {
    sink.published()
        .iter()
        .map(|envelope| {
            let note: Note = serde_json::from_slice(&envelope.payload).expect("a note payload");
            (envelope.key.clone(), note.seq)
        })
        .collect()
}

/// The envelopes of one shard's ordering key, by seq.
fn seqs_of(sink: &MemorySink, key: &str) -> Vec<u64> {
    published(sink)
        .into_iter()
        .filter(|(shard, _)| shard == key)
        .map(|(_, seq)| seq)
        .collect()
}

/// Waits until `sink`'s breaker has closed, failing the test after 15 s.
async fn closed(sink: &MemorySink) {
    tokio::time::timeout(Duration::from_secs(15), sink.breaker().closed())
        .await
        .expect("the breaker closes once the sink is up");
}

/// A sink publishes each delivery to its category's destination, keyed by its shard, with
/// its message id as the de-duplication key, the standard headers and the producer's
/// metadata, and the category's JSON as stored; a shard's messages in order.
pub async fn a_sink_publishes_each_delivery_with_its_keys_and_headers<B: StoreBackend>() {
    let backend = B::create().await;
    let sink = MemorySink::new();
    let relay =
        outbox_core::Relay::with_config(backend.store().clone(), publishing(&sink), config("sink"));
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let ids = write(
        &backend,
        &[
            note::<AuditEvent>(7, 3, 1).with_metadata(TRACEPARENT, traceparent),
            note::<OrgUpdate>(8, 1, 2),
            note::<AuditEvent>(7, 3, 3),
            note::<AuditEvent>(7, 4, 4),
        ],
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(seqs_of(&sink, "1:7"), [1, 3, 4], "events in write order");
    assert_eq!(seqs_of(&sink, "1:8"), [2]);

    let envelopes = sink.published();
    let first = envelopes
        .iter()
        .find(|envelope| envelope.message_id == ids[0])
        .expect("the first event was published");
    assert_eq!(first.destination, "outbox.audit_event");
    assert_eq!(first.category, "audit_event");
    assert_eq!(first.dedup_key, ids[0].0.to_string());
    assert_eq!(
        first.header(headers::MESSAGE_ID),
        Some(&*ids[0].0.to_string())
    );
    assert_eq!(first.header(headers::CATEGORY), Some("audit_event"));
    assert_eq!(first.header(headers::SCOPE), Some("organization"));
    assert_eq!(first.header(headers::SHARD), Some("1:7"));
    assert_eq!(first.header(headers::OBJECT), Some("3"));
    assert_eq!(
        first.header(headers::CONTENT_TYPE),
        Some("application/json")
    );
    assert_eq!(first.header(TRACEPARENT), Some(traceparent));
    let created = first.header(headers::CREATED_AT).expect("a creation time");
    let created = chrono::DateTime::parse_from_rfc3339(created).expect("RFC 3339");
    let age = chrono::Utc::now().signed_duration_since(created);
    assert!(
        age >= chrono::TimeDelta::zero() - chrono::TimeDelta::seconds(5)
            && age < chrono::TimeDelta::minutes(5),
        "written moments ago: {created}"
    );
    let stored: serde_json::Value =
        serde_json::from_slice(&first.payload).expect("the payload is JSON");
    assert_eq!(stored, serde_json::to_value(Note::new(1)).expect("a note"));
    assert!(pending_ids(&backend).await.is_empty(), "all acknowledged");
}

/// A shard's consecutive groups go to the sink at once (pipelined), and only the prefix the
/// broker confirmed is acknowledged: a refusal in the middle leaves it and what follows
/// pending, in order, for the shard's retry.
pub async fn a_sink_takes_a_shards_groups_at_once_and_acknowledges_what_it_confirmed<
    B: StoreBackend,
>() {
    let backend = B::create().await;
    let store = backend.store();
    let sink = MemorySink::new();
    sink.refuse(|envelope| {
        serde_json::from_slice::<Note>(&envelope.payload).is_ok_and(|note| note.seq == 6)
    });
    let relay = outbox_core::Relay::with_config(store.clone(), publishing(&sink), config("all"));
    let ids = write(
        &backend,
        &(1..=10)
            .map(|seq| note::<AuditEvent>(1, seq, seq))
            .collect::<Vec<_>>(),
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.deliveries, 5);
    assert_eq!(sink.batches(), [10], "the read's ten groups at once");
    assert_eq!(seqs_of(&sink, "1:1"), [1, 2, 3, 4, 5]);
    assert_eq!(
        pending_ids(&backend).await,
        ids[5..],
        "the refused one and those after it"
    );
    let state = state_of(&store, &org_shard(1)).await.expect("a state");
    assert_eq!(state.attempts, 1);

    sink.refuse(|_| false);
    assert!(store.reschedule(&org_shard(1)).await.expect("reschedule"));
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(seqs_of(&sink, "1:1"), (1..=10).collect::<Vec<_>>());
    assert!(pending_ids(&backend).await.is_empty());
}

/// A pipelining broker that refuses a message in the middle of a run and stores those after
/// it: they are acknowledged (never published twice), the refused one stays at the shard's
/// head, and once the broker takes it, it follows them.
pub async fn what_a_broker_stored_after_a_refusal_is_not_published_again<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let sink = MemorySink::new();
    sink.set_pipelining(true);
    sink.refuse(|envelope| {
        serde_json::from_slice::<Note>(&envelope.payload).is_ok_and(|note| note.seq == 3)
    });
    let relay = outbox_core::Relay::with_config(store.clone(), publishing(&sink), config("after"));
    let ids = write(
        &backend,
        &(1..=5)
            .map(|seq| note::<AuditEvent>(1, seq, seq))
            .collect::<Vec<_>>(),
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.deliveries, 4, "{report:?}");
    assert_eq!(sink.batches(), [5], "the read's five groups at once");
    assert_eq!(seqs_of(&sink, "1:1"), [1, 2, 4, 5]);
    assert_eq!(
        pending_ids(&backend).await,
        [ids[2]],
        "only the refused one"
    );
    let state = state_of(&store, &org_shard(1)).await.expect("a state");
    assert_eq!(state.attempts, 1, "the refusal is an attempt");

    sink.refuse(|_| false);
    assert!(store.reschedule(&org_shard(1)).await.expect("reschedule"));
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        seqs_of(&sink, "1:1"),
        [1, 2, 4, 5, 3],
        "each once; the refused one after what the broker stored"
    );
    assert!(pending_ids(&backend).await.is_empty());
}

/// A publisher can route, encode and prefix its de-duplication keys its own way.
pub async fn a_publisher_routes_encodes_and_prefixes_its_own_way<B: StoreBackend>() {
    let backend = B::create().await;
    let sink = MemorySink::new();
    let publisher = Publisher::<OrgUpdate, _>::new(sink.clone())
        .to(|delivery: &Delivery<OrgUpdate>| format!("orgs.{}", delivery.shard_identifier()))
        .encode_with("text/plain", |delivery: &Delivery<OrgUpdate>| {
            Ok::<_, BoxError>(delivery.payload.text.clone().into_bytes())
        })
        .dedup_prefix("eu-");
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("the test categories do not conflict");
    let relay = outbox_core::Relay::with_config(backend.store().clone(), registry, config("pub"));
    let ids = write(&backend, &[note::<OrgUpdate>(5, 1, 9)]).await;
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let envelopes = sink.published();
    assert_eq!(envelopes.len(), 1);
    let envelope = &envelopes[0];
    assert_eq!(envelope.destination, "orgs.5");
    assert_eq!(envelope.payload, b"note 9");
    assert_eq!(envelope.header(headers::CONTENT_TYPE), Some("text/plain"));
    assert_eq!(envelope.dedup_key, format!("eu-{}", ids[0].0));
    assert_eq!(
        envelope.header(headers::MESSAGE_ID),
        Some(&*envelope.dedup_key)
    );
}

/// A message the broker refuses is a failure of that message: its shard backs off with the
/// refusal recorded, the other shards are published, and the breaker stays closed.
pub async fn a_refused_message_fails_only_its_shard<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let sink = MemorySink::new();
    sink.refuse(|envelope| envelope.key == "1:1");
    let relay = outbox_core::Relay::with_config(store.clone(), publishing(&sink), config("ref"));
    write(
        &backend,
        &[
            note::<AuditEvent>(1, 1, 1),
            note::<AuditEvent>(1, 1, 2),
            note::<AuditEvent>(2, 1, 3),
            note::<AuditEvent>(3, 1, 4),
        ],
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.failures[0].shard, org_shard(1));
    assert!(report.unavailable.is_empty());
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    assert_eq!(seqs_of(&sink, "1:2"), [3]);
    assert_eq!(seqs_of(&sink, "1:3"), [4]);
    let state = state_of(&store, &org_shard(1)).await.expect("a state");
    assert_eq!(state.attempts, 1, "the refusal counts as an attempt");
    let error = state.last_error.expect("the refusal is recorded");
    assert!(error.contains("refused"), "{error}");
    assert_eq!(
        pending_ids(&backend).await.len(),
        2,
        "shard 1 keeps both rows"
    );
}

/// An unreachable broker opens the sink's breaker: the shards that found it open are released
/// with no attempt counted (no backoff, no dead letter however often it happens), nothing is
/// acknowledged, and no publish reaches the broker while the breaker stays open. Once its
/// probe finds the broker answering, everything is published, each shard in order.
pub async fn an_unreachable_sink_parks_its_shards_without_counting_attempts<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let sink = MemorySink::new();
    sink.set_down(true);
    let relay = outbox_core::Relay::with_config(store.clone(), publishing(&sink), config("out"));
    let ids = write(
        &backend,
        &[
            note::<AuditEvent>(1, 1, 1),
            note::<AuditEvent>(1, 2, 2),
            note::<OrgAlert>(2, 1, 3),
            note::<AuditEvent>(3, 1, 4),
        ],
    )
    .await;
    let first = relay.drain().await.expect("drain");
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    assert_eq!(first.unavailable.len(), 3, "{first:?}");
    assert!(sink.breaker().is_open());
    assert!(sink.attempts() <= 3, "at most one publish per shard");
    let health = relay.health().await;
    assert_eq!(health.open_breakers, ["the memory sink"], "{health:?}");
    let attempts = sink.attempts();
    for _ in 0..3 {
        let again = relay.drain().await.expect("drain");
        assert_eq!(again.unavailable.len(), 3);
        assert!(
            again.dead_lettered.is_empty(),
            "an outage is not the message's failure"
        );
    }
    assert_eq!(
        sink.attempts(),
        attempts,
        "nothing reaches an open breaker's broker"
    );
    for shard in 1..=3 {
        let state = state_of(&store, &org_shard(shard)).await;
        assert!(
            state
                .as_ref()
                .is_none_or(|state| state.attempts == 0 && state.retry_at.is_none()),
            "shard {shard}: no attempt counted, no backoff: {state:?}"
        );
    }
    assert_eq!(pending_ids(&backend).await, ids, "nothing acknowledged");

    sink.set_down(false);
    closed(&sink).await;
    assert!(relay.health().await.open_breakers.is_empty(), "closed");
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(seqs_of(&sink, "1:1"), [1, 2]);
    assert_eq!(seqs_of(&sink, "1:2"), [3]);
    assert_eq!(seqs_of(&sink, "1:3"), [4]);
    assert!(pending_ids(&backend).await.is_empty());
}

/// A running relay stops claiming the shards parked on an open breaker (however often it
/// sweeps), and drains them as soon as the breaker closes, without waiting for a poll.
pub async fn a_running_relay_resumes_parked_shards_when_the_breaker_closes<B: StoreBackend>() {
    let backend = B::create().await;
    let sink = MemorySink::new();
    sink.set_down(true);
    let messages: Vec<_> = (1..=8)
        .flat_map(|shard| {
            [
                note::<AuditEvent>(shard, 1, shard as u64 * 10),
                note::<AuditEvent>(shard, 2, shard as u64 * 10 + 1),
            ]
        })
        .collect();
    write(&backend, &messages).await;
    // Polls hourly after its first sweep: only the breaker's closing can resume the shards.
    let hour = Duration::from_secs(3600);
    let config: RelayConfig = config("parked")
        .to_builder()
        .poll_interval(hour)
        .min_poll_interval(hour)
        .build()
        .expect("a valid relay configuration");
    let relay = outbox_core::Relay::with_config(backend.store().clone(), publishing(&sink), config);
    let (stop, running) = run_until_stopped(&relay);
    eventually("the breaker is open and probed thrice", || {
        sink.breaker().is_open() && sink.probes() >= 3
    })
    .await;
    assert!(
        sink.attempts() <= 8,
        "each shard tried the broker at most once: {}",
        sink.attempts()
    );
    assert!(sink.published().is_empty());

    sink.set_down(false);
    eventually("every message is published", || {
        sink.published().len() == 16
    })
    .await;
    let report = stopped(stop, running).await;
    for shard in 1..=8_u64 {
        assert_eq!(
            seqs_of(&sink, &format!("1:{shard}")),
            [shard * 10, shard * 10 + 1],
            "shard {shard} in order"
        );
    }
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
    assert!(pending_ids(&backend).await.is_empty());
}

/// Polls `store`'s relays until `check` holds of them, failing the test after 15 s.
async fn relays_until<S: Admin>(
    store: &S,
    what: &str,
    check: impl Fn(&[RelayInfo]) -> bool,
) -> Vec<RelayInfo> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let relays = store.relays().await.expect("the relays");
        if check(&relays) {
            return relays;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {relays:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Records two relays' heartbeats, both started at `started`: `relay-a` running (2 shards in
/// flight, 3 waiting on the open breaker `nats`), and `relay-b`, whose heartbeat expires at
/// once; waits until `relay-b` stopped answering, and returns the relays listed then.
pub async fn a_running_and_a_silent_relay<S: Store + Admin>(
    store: &S,
    started: std::time::SystemTime,
) -> Vec<RelayInfo> {
    let running = Heartbeat::new("relay-a", started, Duration::from_secs(60));
    store
        .beat(&running.with_shards(2, 3, vec!["nats".to_owned()]))
        .await
        .expect("beat");
    let silent = Heartbeat::new("relay-b", started, Duration::from_millis(1));
    store.beat(&silent).await.expect("beat");
    relays_until(store, "relay-b stops answering", |relays| {
        relays.len() == 2 && !relays[1].live
    })
    .await
}

/// Heartbeats are listed by worker, live until they expire, for a day after that (a relay
/// that stopped answering), and not at all once their relay left.
pub async fn heartbeats_are_listed_until_their_relay_leaves<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    assert!(store.relays().await.expect("relays").is_empty());
    let started = std::time::SystemTime::now() - Duration::from_secs(60);
    let relays = a_running_and_a_silent_relay(&store, started).await;
    let a = &relays[0];
    assert_eq!(a.worker, "relay-a");
    assert!(a.live, "{a:?}");
    assert_eq!((a.shards_in_flight, a.shards_waiting), (2, 3));
    assert_eq!(a.open_breakers, ["nats"]);
    let drift = a
        .started_at
        .duration_since(started)
        .unwrap_or_else(|early| early.duration());
    assert!(
        drift < Duration::from_millis(2),
        "started to the millisecond: {drift:?}"
    );
    let age = std::time::SystemTime::now()
        .duration_since(a.seen_at)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(10), "seen just now: {age:?}");
    assert_eq!(relays[1].worker, "relay-b");

    // A new heartbeat replaces the row.
    store
        .beat(&Heartbeat::new("relay-a", started, Duration::from_secs(30)))
        .await
        .expect("beat");
    let relays = store.relays().await.expect("relays");
    assert_eq!(
        (relays[0].shards_waiting, relays[0].open_breakers.len()),
        (0, 0)
    );

    store.leave("relay-a").await.expect("leave");
    let relays = store.relays().await.expect("relays");
    assert_eq!(relays.len(), 1, "{relays:?}");
    assert_eq!(relays[0].worker, "relay-b");
}

/// A running relay records its heartbeat from its start: the shards it holds back behind an
/// open breaker and the breaker's name as soon as it opens, none once it closed; and its row
/// goes when it stops.
pub async fn a_running_relay_says_which_breakers_hold_its_shards<B: StoreBackend>() {
    let backend = B::create().await;
    let store = backend.store();
    let sink = MemorySink::new();
    sink.set_down(true);
    let config: RelayConfig = config("beating")
        .to_builder()
        .heartbeat_interval(Duration::from_secs(3600))
        .build()
        .expect("a valid relay configuration");
    let relay = outbox_core::Relay::with_config(store.clone(), publishing(&sink), config);
    let (stop, running) = run_until_stopped(&relay);
    relays_until(&store, "the relay beats at its start", |relays| {
        relays.len() == 1 && relays[0].worker == "beating" && relays[0].live
    })
    .await;
    write(
        &backend,
        &[note::<AuditEvent>(1, 1, 1), note::<AuditEvent>(2, 1, 2)],
    )
    .await;
    // The heartbeat interval is an hour: only the breaker's opening can say so.
    let relays = relays_until(&store, "the open breaker is recorded", |relays| {
        relays
            .first()
            .is_some_and(|relay| relay.shards_waiting == 2)
    })
    .await;
    assert_eq!(relays[0].open_breakers, ["the memory sink"], "{relays:?}");

    sink.set_down(false);
    relays_until(&store, "the closed breaker is recorded", |relays| {
        relays
            .first()
            .is_some_and(|relay| relay.shards_waiting == 0 && relay.open_breakers.is_empty())
    })
    .await;
    let report = stopped(stop, running).await;
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(
        store.relays().await.expect("relays").is_empty(),
        "a relay that stops deletes its row"
    );
}

/// An open breaker is the gauge `outbox_breaker_open` at 1 (0 once it closed), and its
/// openings are counted; the outage's deliveries count as failures of kind `unavailable`.
pub fn an_open_breaker_is_a_gauge_and_its_openings_a_counter<B: StoreBackend>() {
    let ((), telemetry) = crate::telemetry::capture(|probe| async move {
        let backend = B::create().await;
        let sink = MemorySink::new();
        sink.set_down(true);
        let relay = outbox_core::Relay::with_config(
            backend.store().clone(),
            publishing(&sink),
            config("breaker-metrics"),
        );
        write(&backend, &[note::<AuditEvent>(1, 1, 1)]).await;
        let report = relay.drain().await.expect("drain");
        assert_eq!(report.unavailable.len(), 1, "{report:?}");
        let labels = [("breaker", "the memory sink")];
        assert_eq!(probe.gauge(BREAKER_OPEN, &labels), Some(1.0));
        assert_eq!(probe.counter(BREAKER_OPENINGS, &labels), 1);
        let failures = probe.counter(
            "outbox_handler_failures_total",
            &[
                ("category", "audit_event"),
                ("scope", "organization"),
                ("kind", "unavailable"),
            ],
        );
        assert_eq!(failures, 1);

        sink.set_down(false);
        closed(&sink).await;
        assert_eq!(probe.gauge(BREAKER_OPEN, &labels), Some(0.0));
        assert!(relay.drain().await.expect("drain").is_clean());
    });
    assert_eq!(
        telemetry.counter(BREAKER_OPENINGS, &[("breaker", "the memory sink")]),
        1
    );
}
