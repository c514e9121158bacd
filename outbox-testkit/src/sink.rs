//! [`MemorySink`]: a sink that keeps what it is given, for testing publishers and outages
//! without a broker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::sink::{
    Breaker, Envelope, ProbeDelays, Published, Sink, SinkError, one_at_a_time,
};

type Refusal = dyn Fn(&Envelope) -> bool + Send + Sync;

/// A [`Sink`] that keeps the envelopes it confirms, in the order it confirmed them. It can be
/// taken down ([`MemorySink::set_down`]: every publish and probe fails as an unreachable broker
/// would) and told to refuse some messages ([`MemorySink::refuse`]). Its breaker probes every
/// 10 ms to 100 ms.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct MemorySink {
    inner: Arc<Inner>,
    down: Arc<Down>,
    breaker: Breaker,
}

#[derive(Default)]
struct Inner {
    published: Mutex<Vec<Envelope>>,
    /// The size of each `publish_all` call.
    batches: Mutex<Vec<usize>>,
    attempts: AtomicU64,
    refuse: Mutex<Option<Arc<Refusal>>>,
    /// Whether a refusal leaves the later envelopes of a `publish_all` call in flight.
    pipelining: AtomicBool,
}

impl std::fmt::Debug for MemorySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySink")
            .field("published", &self.published().len())
            .field("attempts", &self.attempts())
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl Default for MemorySink {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a [`MemorySink`] is down, shared with its breaker's probe.
#[derive(Default)]
struct Down {
    down: AtomicBool,
    probes: AtomicU64,
}

impl MemorySink {
    /// An empty sink, up.
    pub fn new() -> Self {
        let down = Arc::new(Down::default());
        let probed = Arc::clone(&down);
        let delays = ProbeDelays {
            first: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        let breaker = Breaker::with_delays("the memory sink", delays, move || {
            let down = Arc::clone(&probed);
            async move {
                down.probes.fetch_add(1, Ordering::Relaxed);
                if down.down.load(Ordering::Acquire) {
                    Err("the memory sink is down".into())
                } else {
                    Ok(())
                }
            }
        });
        Self {
            inner: Arc::new(Inner::default()),
            down,
            breaker,
        }
    }

    /// Takes the sink down (`true`: publishes and probes fail as if the broker were
    /// unreachable) or brings it back up.
    pub fn set_down(&self, down: bool) {
        self.down.down.store(down, Ordering::Release);
    }

    /// Makes the sink take each [`Sink::publish_all`] call's envelopes all in flight, as a
    /// pipelining broker does (Kafka, RabbitMQ, Redis): one it refuses does not stop it from
    /// storing those after it, which it reports as [`Published::confirmed_after`]. By default
    /// it stops at the first refusal.
    pub fn set_pipelining(&self, pipelining: bool) {
        self.inner.pipelining.store(pipelining, Ordering::Release);
    }

    /// Refuses every message for which `refuse` holds, as a broker refuses one that is too
    /// large or has no stream.
    pub fn refuse(&self, refuse: impl Fn(&Envelope) -> bool + Send + Sync + 'static) {
        *self
            .inner
            .refuse
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(refuse));
    }

    /// The envelopes confirmed so far, in order.
    pub fn published(&self) -> Vec<Envelope> {
        self.inner
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many publishes reached the sink, confirmed or not.
    pub fn attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// The number of envelopes of each [`Sink::publish_all`] call so far (a shard's
    /// consecutive messages, given at once), in order.
    pub fn batches(&self) -> Vec<usize> {
        self.inner
            .batches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times its breaker probed it.
    pub fn probes(&self) -> u64 {
        self.down.probes.load(Ordering::Relaxed)
    }
}

impl Sink for MemorySink {
    async fn publish_all(&self, envelopes: Vec<Envelope>) -> Published {
        self.inner
            .batches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(envelopes.len());
        if !self.inner.pipelining.load(Ordering::Acquire) {
            return one_at_a_time(self, envelopes).await;
        }
        let mut outcomes = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            outcomes.push(self.publish(envelope).await);
        }
        Published::from_outcomes(outcomes)
    }

    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        if self.down.down.load(Ordering::Acquire) {
            return Err(SinkError::Unavailable("connection refused".into()));
        }
        let refuse = self
            .inner
            .refuse
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if refuse.is_some_and(|refuse| refuse(&envelope)) {
            return Err(SinkError::Refused(
                format!("message {} refused", envelope.dedup_key).into(),
            ));
        }
        self.inner
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(envelope);
        Ok(())
    }

    fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    fn destination(&self, category: &'static str) -> String {
        format!("outbox.{category}")
    }
}

/// A sink that publishes through `K`, then never returns: the relay process dying between
/// the broker's confirmation and the outbox's acknowledgement. Drive a relay with it in a task,
/// wait for [`DiesAfterPublishing::published`], abort the task, and let another relay take the
/// shard over once its lease lapses: what it publishes again carries the same
/// de-duplication key.
#[derive(Debug, Clone)]
pub struct DiesAfterPublishing<K> {
    sink: K,
    published: Arc<tokio::sync::Notify>,
}

impl<K: Sink + Clone> DiesAfterPublishing<K> {
    /// Publishes through `sink`.
    pub fn new(sink: K) -> Self {
        Self {
            sink,
            published: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Waits until a publish was confirmed (made before or after this call).
    pub async fn published(&self) {
        self.published.notified().await;
    }
}

impl<K: Sink> Sink for DiesAfterPublishing<K> {
    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        self.sink.publish(envelope).await?;
        // Stored as a permit: a waiter that comes later still sees it.
        self.published.notify_one();
        std::future::pending().await
    }

    fn breaker(&self) -> &Breaker {
        self.sink.breaker()
    }

    fn destination(&self, category: &'static str) -> String {
        self.sink.destination(category)
    }
}
