//! The relay's behaviour, on the in-memory store: no database, and time that moves when the
//! test says (a [`ManualClock`] for leases and backoff, tokio's paused clock for heartbeats).

mod delivery;
mod failure;
mod flush;
mod leases;
mod running;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::handler::Handler;
use outbox_core::memory::{ManualClock, MemoryStore};
use outbox_core::{
    Backoff, BoxError, Category, CategoryId, Delivery, Message, Registry, RegistryBuilder, Relay,
    RelayConfig, Scope, ScopeId, ShardKey,
};

/// Organizations.
struct Org;
impl Scope for Org {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "org";
}

/// A coalescing category.
struct Update;
impl Category for Update {
    type Scope = Org;
    type Payload = u64;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "update";
}

/// A non-coalescing category: every message, in order.
struct Event;
impl Category for Event {
    type Scope = Org;
    type Payload = u64;
    const ID: CategoryId = CategoryId(2);
    const NAME: &'static str = "event";
    const COALESCE: bool = false;
}

fn shard(id: i64) -> ShardKey {
    ShardKey::local(Org::ID, id)
}

/// A message of `C` in shard `shard` about `object`, carrying `seq`.
fn msg<C: Category<Payload = u64>>(shard: i64, object: i64, seq: u64) -> Message {
    Message::new::<C>(shard, object, &seq).expect("a number serializes")
}

/// One delivery, as a handler saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    shard: i64,
    object: i64,
    seq: u64,
    attempt: u32,
}

/// Records deliveries across tasks.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn record<C: Category<Payload = u64>>(&self, delivery: &Delivery<C>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                shard: i64::try_from(delivery.shard_identifier()).unwrap(),
                object: i64::try_from(delivery.object_identifier).unwrap(),
                seq: delivery.payload,
                attempt: delivery.attempt,
            });
    }

    fn seen(&self) -> Vec<Seen> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `(shard, object, seq)` of every delivery, in order.
    fn triples(&self) -> Vec<(i64, i64, u64)> {
        self.seen()
            .iter()
            .map(|seen| (seen.shard, seen.object, seen.seq))
            .collect()
    }

    fn handler<C: Category<Payload = u64>>(&self) -> impl Handler<Delivery<C>> + use<C> {
        let recorder = self.clone();
        move |delivery: Delivery<C>| {
            recorder.record(&delivery);
            async { Ok::<(), BoxError>(()) }
        }
    }

    /// Both categories recorded.
    fn registry(&self) -> Registry {
        self.builder().build().expect("registry")
    }

    fn builder(&self) -> RegistryBuilder {
        Registry::builder()
            .handle::<Update>(self.handler())
            .handle::<Event>(self.handler())
    }

    /// `Update` handled by `handler`, `Event` recorded.
    fn registry_with(&self, handler: impl Handler<Delivery<Update>>) -> Registry {
        Registry::builder()
            .handle::<Update>(handler)
            .handle::<Event>(self.handler())
            .build()
            .expect("registry")
    }
}

/// Holds handlers inside their delivery until opened: how a test stops a relay at an exact
/// point without sleeping.
#[derive(Debug, Clone)]
struct Gate {
    entered: Arc<tokio::sync::Notify>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Self {
            entered: Arc::default(),
            open: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    /// A handler of `Update` that records, then waits at the gate.
    fn handler(&self, recorder: &Recorder) -> impl Handler<Delivery<Update>> + use<> {
        let (gate, recorder) = (self.clone(), recorder.clone());
        move |delivery: Delivery<Update>| {
            recorder.record(&delivery);
            let gate = gate.clone();
            async move {
                gate.entered.notify_one();
                let _open = gate.open.acquire().await.expect("never closed");
                Ok::<(), BoxError>(())
            }
        }
    }

    /// Waits until a handler is inside.
    async fn entered(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.entered.notified())
            .await
            .expect("a handler entered the gate");
    }

    fn open(&self) {
        self.open.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    }
}

/// A quick configuration for tests: 2 s backoff doubling to 60 s without jitter (the tests
/// move the clock by exact delays), quick polling.
fn config(worker: &str) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .poll_interval(Duration::from_millis(20))
        .backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(60)).with_jitter(false))
        .build()
        .expect("a valid relay configuration")
}

/// A store on a clock the test moves.
fn clocked() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn relay(store: &MemoryStore, registry: Registry, config: RelayConfig) -> Relay<MemoryStore> {
    Relay::with_config(store.clone(), registry, config)
}

/// Waits until `check` holds, failing after 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
