//! A circuit breaker in front of a downstream system (a broker): opened by the first delivery
//! that finds the system unreachable, closed by a probe that finds it answering again.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::error::{BoxError, error_chain};
use crate::future::BoxFuture;

/// How often an open breaker probes its system: after `first`, doubling after each failed
/// probe up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeDelays {
    /// The delay before the first probe.
    pub first: Duration,
    /// The longest delay between two probes.
    pub max: Duration,
}

impl Default for ProbeDelays {
    /// 50 ms, doubling to 5 s.
    fn default() -> Self {
        Self {
            first: Duration::from_millis(50),
            max: Duration::from_secs(5),
        }
    }
}

type Probe = dyn Fn() -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync;

/// A circuit breaker in front of a downstream system: a broker, a service.
///
/// While it is closed, deliveries go through. A delivery that finds the system unreachable
/// opens it ([`Breaker::unavailable`]): the relay then stops claiming the shards that wait on
/// it, instead of every shard failing and backing off on its own, and the breaker probes the
/// system in the background (its probe function, every [`ProbeDelays`]). When a probe
/// succeeds, it closes and the relay drains those shards again at once. Attempts made during
/// an outage do not count towards any dead-letter policy.
///
/// Cheap to clone; clones are the same breaker. The sinks make one for each connection; a
/// handler of your own makes one with [`Breaker::new`] and returns
/// [`Breaker::unavailable`]'s error when its system does not answer.
#[derive(Clone)]
pub struct Breaker {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    name: String,
    probe: Box<Probe>,
    delays: ProbeDelays,
    /// `true` while open.
    open: watch::Sender<bool>,
    probing: AtomicBool,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.inner.name)
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// A closed breaker named `name` (in logs and errors: `"NATS at 127.0.0.1:4222"`), whose
    /// probe is `probe`: it succeeds when the system answers. Probes come after 50 ms,
    /// doubling to 5 s.
    pub fn new<F, Fut>(name: impl Into<String>, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        Self::with_delays(name, ProbeDelays::default(), probe)
    }

    /// A closed breaker probing at the given delays.
    pub fn with_delays<F, Fut>(name: impl Into<String>, delays: ProbeDelays, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Arc::new(Inner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                name: name.into(),
                probe: Box::new(move || Box::pin(probe())),
                delays,
                open: watch::Sender::new(false),
                probing: AtomicBool::new(false),
            }),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A number telling this breaker from every other one in the process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether it is open: the system was found unreachable and no probe has answered since.
    pub fn is_open(&self) -> bool {
        *self.inner.open.borrow()
    }

    /// Opens the breaker because of `error` (logged once per outage) and starts probing, in
    /// a task of its own on the current tokio runtime. The error to return from a delivery is
    /// [`Breaker::unavailable`]'s.
    pub fn open(&self, error: &(dyn std::error::Error + 'static)) {
        let opened = self
            .inner
            .open
            .send_if_modified(|open| !std::mem::replace(open, true));
        if opened {
            crate::telemetry::breaker_opened(&self.inner.name);
            warn!(breaker = %self.inner.name, error = %error_chain(error), "unavailable; its shards wait until it answers");
        }
        self.start_probing();
    }

    /// Opens the breaker and returns the error a delivery returns for it: the relay parks the
    /// delivery's shard until the breaker closes, without counting an attempt.
    pub fn unavailable(&self, source: impl Into<BoxError>) -> Unavailable {
        let source = source.into();
        self.open(source.as_ref());
        Unavailable {
            breaker: self.clone(),
            source,
        }
    }

    /// Closes the breaker: the system answers. Probes do this; a caller that learns it
    /// otherwise may too.
    pub fn close(&self) {
        if self
            .inner
            .open
            .send_if_modified(|open| std::mem::replace(open, false))
        {
            crate::telemetry::breaker_closed(&self.inner.name);
            info!(breaker = %self.inner.name, "answers again; its shards resume");
        }
    }

    /// Waits until the breaker is closed (at once if it is).
    pub async fn closed(&self) {
        let mut open = self.inner.open.subscribe();
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = open.wait_for(|open| !*open).await;
    }

    /// Probes once now: closes the breaker if the system answers.
    pub async fn probe(&self) -> Result<(), BoxError> {
        (self.inner.probe)().await?;
        self.close();
        Ok(())
    }

    fn start_probing(&self) {
        if self.inner.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.probing.store(false, Ordering::Release);
            warn!(breaker = %self.inner.name, "opened outside a tokio runtime: nothing probes it; call `Breaker::probe`");
            return;
        };
        let breaker = self.clone();
        runtime.spawn(async move { breaker.probe_until_closed().await });
    }

    async fn probe_until_closed(self) {
        let ProbeDelays { first, max } = self.inner.delays;
        let mut delay = first;
        while self.is_open() {
            tokio::time::sleep(delay).await;
            match self.probe().await {
                Ok(()) => break,
                Err(error) => {
                    debug!(breaker = %self.inner.name, error = %error_chain(error.as_ref()), ?delay, "probe failed; still unavailable");
                    delay = (delay * 2).min(max);
                }
            }
        }
        self.inner.probing.store(false, Ordering::Release);
        // Opened again between the last probe and the flag's reset: probe for that outage.
        if self.is_open() {
            self.start_probing();
        }
    }
}

/// A delivery's error when its downstream system is unreachable: returned by the sinks, or by
/// a handler of your own through [`Breaker::unavailable`]. The relay parks the shard on the
/// breaker and counts no attempt.
#[derive(Debug, thiserror::Error)]
#[error("`{}` is unavailable", breaker.name())]
pub struct Unavailable {
    /// The breaker it opened.
    pub breaker: Breaker,
    /// Why the system is thought unreachable.
    #[source]
    pub source: BoxError,
}
