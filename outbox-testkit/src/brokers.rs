//! The tests every sink passes against its real broker, written once: a sink crate gives each
//! a sink and a way to read back what its broker holds, and asserts what is particular to it.
//!
//! The outbox is a SQLite file; the messages are [`AuditEvent`]s (every one delivered, in write
//! order per shard), seq `shard * 1000 + n` for the `n`-th message of a shard.
//!
//! - [`publishes_in_order`]: 40 shards of 5 events, drained; each shard's seqs in order, each
//!   message once under its own message id.
//! - [`crash_and_redeliver`]: a relay dies between the broker's confirmation and the
//!   acknowledgement; another takes the shard over and publishes the message again.
//! - [`refusal_fails_only_its_shard`]: a publisher that sends shard 1 where the broker refuses
//!   it; only shard 1 fails, the breaker stays closed.
//! - [`refusal_in_a_run_publishes_nothing_twice`]: the broker refuses the middle message of a
//!   shard's pipelined run and stores those after it; they are acknowledged, and the refused
//!   one, once the broker takes it, is the only one published again. Published one at a
//!   time, the refusal stops the shard, and the broker holds it in order.
//! - [`rides_out_an_outage`]: a running relay, the connection cut and restored; nothing lost,
//!   every shard in order, the breaker opened and closed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::sink::{Publisher, Sink};
use outbox_core::{DrainReport, Message, MessageId, Registry, Relay, RelayConfig, RunReport};

use crate::backend::StoreBackend;
use crate::fixtures::{AuditEvent, note};
use crate::sink::DiesAfterPublishing;
use crate::sqlite::SqliteBackend;

/// One message as a broker holds it: its shard's ordering key (`Outbox-Shard`), its outbox
/// message id (`Outbox-Message-Id`), and its note's seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The shard's ordering key, `1:<shard>`.
    pub shard: String,
    /// The outbox message id the broker holds it under.
    pub message_id: String,
    /// The note's seq.
    pub seq: u64,
}

/// `shards` shards of `per_shard` audit events each, the seq `shard * 1000 + n`.
pub fn events(shards: u64, per_shard: u64) -> Vec<Message> {
    (1..=shards)
        .flat_map(|shard| shard_events(shard, per_shard))
        .collect()
}

/// `per_shard` audit events in shard `shard`, the seq `shard * 1000 + n`.
fn shard_events(shard: u64, per_shard: u64) -> impl Iterator<Item = Message> {
    (1..=per_shard).map(move |n| note::<AuditEvent>(shard, n, shard * 1000 + n))
}

/// A relay configuration for broker tests: quick polling, 16 shards at once.
pub fn relay_config(worker: &str) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .poll_interval(Duration::from_millis(50))
        .max_concurrent_shards(16)
        .build()
        .expect("a valid relay configuration")
}

/// A registry publishing the audit events through `sink`.
pub fn registry(sink: impl Sink) -> Registry {
    Registry::builder()
        .sink::<AuditEvent, _>(sink)
        .build()
        .expect("a registry")
}

/// The seqs stored for each shard, in the broker's order.
pub fn by_shard(stored: &[Stored]) -> BTreeMap<String, Vec<u64>> {
    let mut shards: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in stored {
        shards
            .entry(message.shard.clone())
            .or_default()
            .push(message.seq);
    }
    shards
}

/// Waits until `check` holds, failing the test after 30 s.
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drains 40 shards of 5 events through `sink`, reads them back with `read`, and checks that
/// every shard is in write order and every message is stored once under its own message id.
/// Returns what `read` found, for the sink's own checks.
pub async fn publishes_in_order<K: Sink>(
    sink: K,
    read: impl AsyncFnOnce(usize) -> Vec<Stored>,
) -> Vec<Stored> {
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry(sink), relay_config("in-order"));
    let ids = backend.write(&events(40, 5)).await.expect("write");
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.deliveries, 200);
    let stored = read(200).await;
    assert_eq!(stored.len(), 200);
    let shards = by_shard(&stored);
    assert_eq!(shards.len(), 40);
    for (shard, seqs) in &shards {
        let number: u64 = shard.trim_start_matches("1:").parse().expect("a shard key");
        let expected: Vec<u64> = (1..=5).map(|n| number * 1000 + n).collect();
        assert_eq!(seqs, &expected, "shard {shard} in write order");
    }
    let mut message_ids: Vec<i64> = stored
        .iter()
        .map(|message| message.message_id.parse().expect("a message id"))
        .collect();
    message_ids.sort_unstable();
    let written: Vec<i64> = ids.iter().map(|id| id.0).collect();
    assert_eq!(message_ids, written, "each message once, under its own id");
    stored
}

/// Writes one event; a relay publishes it through `sink` and dies before acknowledging it
/// (then `after_crash` runs: the broker holds it once); another relay takes the shard over
/// once the lease lapses and publishes it again. The message's id.
pub async fn crash_and_redeliver<K: Sink + Clone>(
    sink: K,
    after_crash: impl AsyncFnOnce(),
) -> MessageId {
    let backend = SqliteBackend::create().await;
    let dying = DiesAfterPublishing::new(sink.clone());
    let doomed = Relay::with_config(
        backend.store(),
        registry(dying.clone()),
        relay_config("doomed")
            .to_builder()
            .lease(Duration::from_millis(300))
            .build()
            .expect("config"),
    );
    let ids = backend
        .write(&[note::<AuditEvent>(1, 1, 1)])
        .await
        .expect("write");
    let running = tokio::spawn(async move { doomed.drain().await });
    dying.published().await;
    running.abort();
    after_crash().await;

    let survivor = Relay::with_config(backend.store(), registry(sink), relay_config("survivor"));
    let mut redelivered = 0;
    eventually("the survivor takes the shard over", async || {
        let report = survivor.drain().await.expect("drain");
        redelivered += report.deliveries;
        redelivered == 1
    })
    .await;
    ids[0]
}

/// Drains 3 shards of 2 events through `publisher`, which sends shard 1 where the broker
/// refuses it: only shard 1 fails, its error's chain holds `refusal`, the sink's breaker stays
/// closed, and (read back with `read`) shards 2 and 3 are stored, in order, and shard 1 not.
pub async fn refusal_fails_only_its_shard<K: Sink + Clone>(
    publisher: Publisher<AuditEvent, K>,
    sink: &K,
    refusal: &str,
    read: impl AsyncFnOnce(usize) -> Vec<Stored>,
) -> DrainReport {
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("a registry");
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry, relay_config("refused"));
    backend.write(&events(3, 2)).await.expect("write");
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let failure = &report.failures[0];
    assert_eq!(failure.shard.shard_identifier, outbox_core::Id::from(1_i64));
    let error = outbox_core::error::error_chain(&failure.error);
    assert!(error.contains(refusal), "{error}");
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    let shards = by_shard(&read(4).await);
    assert_eq!(shards.get("1:2"), Some(&vec![2001, 2002]));
    assert_eq!(shards.get("1:3"), Some(&vec![3001, 3002]));
    assert!(!shards.contains_key("1:1"));
    report
}

/// The seq of the message [`refusal_in_a_run_publishes_nothing_twice`] sends where the broker
/// refuses it: the third of shard 1's five.
pub const REFUSED_IN_A_RUN: u64 = 1003;

/// Drains one shard of 5 events through `sink`, all in one pipelined run: the third
/// ([`REFUSED_IN_A_RUN`]) goes to destination `refused`, where the broker refuses it, the
/// others to `stored`. The four others are stored and acknowledged; the third alone stays
/// pending. Then the third goes to `stored` too, and a second drain publishes it and nothing
/// else: (read back with `read`) each message stored once, the refused one last.
///
/// Then the same with a publisher that publishes one at a time
/// ([`Publisher::one_at_a_time`]), in shard 2: the refused message (2003) stops its shard
/// before anything behind it is sent, and once the broker takes it the shard is stored in
/// its order, each message once.
pub async fn refusal_in_a_run_publishes_nothing_twice<K: Sink + Clone>(
    sink: K,
    stored: String,
    refused: String,
    mut read: impl AsyncFnMut(usize) -> Vec<Stored>,
) {
    let backend = SqliteBackend::create().await;
    let pipelined = Refusal {
        shard: 1,
        one_at_a_time: false,
    };
    let seqs = pipelined
        .drain(&backend, sink.clone(), &stored, &refused, &mut read, 0)
        .await;
    assert_eq!(seqs, [1001, 1002, 1004, 1005, REFUSED_IN_A_RUN]);
    let one_at_a_time = Refusal {
        shard: 2,
        one_at_a_time: true,
    };
    let seqs = one_at_a_time
        .drain(&backend, sink, &stored, &refused, &mut read, 5)
        .await;
    assert_eq!(seqs, [2001, 2002, 2003, 2004, 2005]);
}

/// One shard of five events drained through a publisher that sends its third where the
/// broker refuses it, then, once it goes where the broker takes it, drained again.
struct Refusal {
    shard: u64,
    one_at_a_time: bool,
}

impl Refusal {
    /// Runs it on `backend`, the broker holding `before` messages already; checks what the
    /// first drain stores and leaves pending, and that the second publishes only what the
    /// first did not. The shard's seqs as the broker holds them at the end.
    async fn drain<K: Sink>(
        &self,
        backend: &SqliteBackend,
        sink: K,
        stored: &str,
        refused: &str,
        read: &mut impl AsyncFnMut(usize) -> Vec<Stored>,
        before: usize,
    ) -> Vec<u64> {
        let refused_seq = self.shard * 1000 + 3;
        let accepted = Arc::new(AtomicBool::new(false));
        let accepting = Arc::clone(&accepted);
        let (stored, refused) = (stored.to_owned(), refused.to_owned());
        let publisher = Publisher::<AuditEvent, _>::new(sink).to(move |delivery| {
            if delivery.payload.seq == refused_seq && !accepting.load(Ordering::Acquire) {
                refused.clone()
            } else {
                stored.clone()
            }
        });
        let publisher = if self.one_at_a_time {
            publisher.one_at_a_time()
        } else {
            publisher
        };
        let registry = Registry::builder()
            .publish(publisher)
            .build()
            .expect("a registry");
        let store = backend.store();
        let relay = Relay::with_config(store.clone(), registry, relay_config("in-a-run"));
        let messages: Vec<Message> = shard_events(self.shard, 5).collect();
        let ids = backend.write(&messages).await.expect("write");
        let report = relay.drain().await.expect("drain");
        assert_eq!(report.failures.len(), 1, "{report:?}");
        let pending: Vec<MessageId> = store
            .pending_messages(10)
            .await
            .expect("pending")
            .into_iter()
            .map(|row| row.id)
            .collect();
        let key = format!("1:{}", self.shard);
        let first: Vec<u64> = (1..=5)
            .map(|n| self.shard * 1000 + n)
            .filter(|&seq| seq != refused_seq)
            .collect();
        if self.one_at_a_time {
            // Nothing behind the refused message was sent.
            assert_eq!(report.deliveries, 2, "{report:?}");
            assert_eq!(pending, ids[2..], "the refused message and those after it");
            let held = by_shard(&read(before + 2).await);
            assert_eq!(held.get(&key), Some(&first[..2].to_vec()));
        } else {
            assert_eq!(report.deliveries, 4, "{report:?}");
            assert_eq!(pending, [ids[2]], "only the refused message is pending");
            let held = by_shard(&read(before + 4).await);
            assert_eq!(held.get(&key), Some(&first));
        }

        accepted.store(true, Ordering::Release);
        let shard = report.failures[0].shard.clone();
        assert!(store.reschedule(&shard).await.expect("reschedule"));
        let again = relay.drain().await.expect("drain");
        assert!(again.is_clean(), "{again:?}");
        assert_eq!(
            again.deliveries,
            5 - report.deliveries,
            "only what was not published: {again:?}"
        );
        let held = read(before + 5).await;
        by_shard(&held).remove(&key).unwrap_or_default()
    }
}

/// A running relay publishes 5 events through `sink`; `cut` takes the broker away, 10 more
/// are written and the breaker opens with nothing more stored; `restore` brings it back, and
/// everything is stored, each shard in order, each message once, nothing left pending. `count`
/// says how many messages the broker holds; `read` reads them all (called once, at the end,
/// for 15). The relay's report.
pub async fn rides_out_an_outage<K: Sink + Clone>(
    sink: K,
    mut count: impl AsyncFnMut() -> usize,
    cut: impl FnOnce(),
    restore: impl FnOnce(),
    read: impl AsyncFnOnce(usize) -> Vec<Stored>,
) -> RunReport {
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(
        backend.store(),
        registry(sink.clone()),
        relay_config("outage"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let relay = relay.clone();
        tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        })
    };
    backend.write(&events(5, 1)).await.expect("write");
    eventually("the first messages are stored", async || count().await >= 5).await;

    cut();
    let during: Vec<_> = (1..=5)
        .flat_map(|shard| [2, 3].map(|n| note::<AuditEvent>(shard, n, shard * 1000 + n)))
        .collect();
    backend
        .write(&during)
        .await
        .expect("write during the outage");
    eventually("the breaker opens", async || sink.breaker().is_open()).await;
    assert_eq!(count().await, 5, "nothing stored while the broker is away");

    restore();
    eventually("everything is stored", async || count().await >= 15).await;
    let _ = stop.send(());
    let report = running
        .await
        .expect("the relay does not panic")
        .expect("the relay stops cleanly");
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
    assert!(!sink.breaker().is_open());
    let shards = by_shard(&read(15).await);
    for shard in 1..=5_u64 {
        assert_eq!(
            shards.get(&format!("1:{shard}")),
            Some(&vec![shard * 1000 + 1, shard * 1000 + 2, shard * 1000 + 3]),
            "shard {shard} in order, each once"
        );
    }
    let pending = backend
        .store()
        .pending_messages(100)
        .await
        .expect("pending");
    assert!(pending.is_empty());
    report
}
