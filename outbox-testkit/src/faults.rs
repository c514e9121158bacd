//! Fault injection: handlers that fail, panic or stall on purpose, to test what a relay (or
//! the code around it) does when a handler misbehaves.
//!
//! A [`Faulty`] wraps a handler, or stands alone in place of one ([`Succeed`] is then what it
//! delegates to). It is a [`Handler`] of whatever the wrapped handler handles: the deliveries
//! of a category, or the replications or deletions of a replicated model, and it takes what
//! the wrapped handler takes. On the calls its fault applies to it:
//!
//! - [`Fault::Fail`]: returns an [`InjectedFault`] error (the relay reports it as the source
//!   of a [`DeliveryError::Handler`](outbox_core::DeliveryError::Handler));
//! - [`Fault::Panic`]: panics with the [`InjectedFault`]'s message (the relay reports a
//!   [`DeliveryError::Panicked`](outbox_core::DeliveryError::Panicked));
//! - [`Fault::Sleep`]: waits (a tokio sleep), then delegates.
//!
//! Every other call is delegated. Clones share one set of counters, safely across the tasks
//! the relay runs handlers on: keep a clone to read [`Faulty::calls`] and
//! [`Faulty::injected`] after handing the handler to a registry.
//!
//! ```
//! use outbox_core::{Delivery, Registry};
//! use outbox_testkit::faults::Faulty;
//! use outbox_testkit::fixtures::OrgUpdate;
//! use outbox_testkit::recorder::Recording;
//!
//! let recording = Recording::<OrgUpdate>::new();
//! // The first two calls fail; the third and later reach the recording.
//! let faulty = Faulty::fail_times(2, recording.clone());
//! let registry = Registry::builder().handle::<OrgUpdate>(faulty.clone());
//! # let _ = registry;
//! assert_eq!(faulty.calls(), 0);
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox_core::{BoxError, Id, ShardKey};

use outbox_core::handler::{DeliveryKind, Handler, HandlerContext, Requirements};

/// What a [`Faulty`] handler does on the calls its fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Return an [`InjectedFault`] error.
    Fail,
    /// Panic with the [`InjectedFault`]'s message.
    Panic,
    /// Sleep this long (a tokio sleep), then delegate.
    Sleep(Duration),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fail => f.write_str("failure"),
            Self::Panic => f.write_str("panic"),
            Self::Sleep(duration) => write!(f, "sleep of {duration:?}"),
        }
    }
}

/// The error a [`Faulty`] handler returns (or the message it panics with): which fault, which
/// of the faults, on which call, for which delivery.
///
/// Its message reads, for example, `injected failure 1 of 2 on call 1 (delivery attempt 1 of
/// object 7 in scope 1 shard 3)`, or `injected failure on call 3, failing every call (...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InjectedFault {
    /// The fault: [`Fault::Fail`], or [`Fault::Panic`] for the message of a panic.
    pub fault: Fault,
    /// Which injected fault this is: 1 for the first.
    pub number: u32,
    /// How many calls the fault applies to; `None` for every call.
    pub times: Option<u32>,
    /// The handler call, counting every call of the handler and its clones: 1 for the first.
    pub call: u32,
    /// The delivery's attempt, as the relay numbers it: 1 the first time.
    pub attempt: u32,
    /// The shard of the delivery.
    pub shard: ShardKey,
    /// The object of the delivery.
    pub object_identifier: Id,
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.times {
            Some(times) => write!(
                f,
                "injected {} {} of {times} on call {}",
                self.fault, self.number, self.call
            )?,
            None => write!(
                f,
                "injected {} on call {}, failing every call",
                self.fault, self.call
            )?,
        }
        write!(
            f,
            " (delivery attempt {} of object {} in {})",
            self.attempt, self.object_identifier, self.shard
        )
    }
}

impl std::error::Error for InjectedFault {}

/// What a [`Faulty`] handler knows of one call, for [`Faulty::when`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Call<'a> {
    /// The shard of the delivery.
    pub shard: &'a ShardKey,
    /// The object of the delivery.
    pub object_identifier: Id,
    /// The delivery's attempt, as the relay numbers it: 1 the first time.
    pub attempt: u32,
}

/// A handler that acknowledges every delivery, replication and deletion: what a standalone
/// [`Faulty`] delegates to.
#[derive(Debug, Clone, Copy, Default)]
pub struct Succeed;

impl<D: DeliveryKind> Handler<D> for Succeed {
    async fn call(&self, _delivery: D, _cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        Ok(())
    }
}

type Predicate = Arc<dyn Fn(&Call<'_>) -> bool + Send + Sync>;

/// When a fault applies.
#[derive(Clone)]
struct Plan {
    fault: Fault,
    times: Option<u32>,
    when: Option<Predicate>,
}

/// Counters shared by a handler and its clones.
#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU32,
    eligible: AtomicU32,
    injected: AtomicU32,
}

/// A handler that injects a [`Fault`] into some of its calls and delegates the others (and,
/// for [`Fault::Sleep`], the slowed ones) to the handler it wraps. See the [module](self).
pub struct Faulty<H = Succeed> {
    inner: Arc<H>,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
}

impl<H> Clone for Faulty<H> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            plan: Arc::clone(&self.plan),
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<H> fmt::Debug for Faulty<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("fault", &self.plan.fault)
            .field("times", &self.plan.times)
            .field("filtered", &self.plan.when.is_some())
            .field("calls", &self.calls())
            .field("injected", &self.injected())
            .finish_non_exhaustive()
    }
}

impl Faulty {
    /// A handler whose every call fails with an [`InjectedFault`].
    pub fn fail_always() -> Self {
        Self::new(Fault::Fail, None, Succeed)
    }

    /// A handler whose every call panics.
    pub fn panic_always() -> Self {
        Self::new(Fault::Panic, None, Succeed)
    }
}

impl<H> Faulty<H> {
    /// Injects `fault` into the first `times` calls (`None`: every call), and delegates the
    /// others to `handler`.
    pub fn new(fault: Fault, times: Option<u32>, handler: H) -> Self {
        Self {
            inner: Arc::new(handler),
            plan: Arc::new(Plan {
                fault,
                times,
                when: None,
            }),
            counters: Arc::default(),
        }
    }

    /// Fails the first `times` calls with an [`InjectedFault`], then delegates to `handler`
    /// (use [`Succeed`] for a handler that then just succeeds).
    pub fn fail_times(times: u32, handler: H) -> Self {
        Self::new(Fault::Fail, Some(times), handler)
    }

    /// Panics in the first `times` calls, then delegates to `handler`.
    pub fn panic_times(times: u32, handler: H) -> Self {
        Self::new(Fault::Panic, Some(times), handler)
    }

    /// Sleeps `duration` at every call, then delegates to `handler`: a slow handler.
    pub fn sleep(duration: Duration, handler: H) -> Self {
        Self::new(Fault::Sleep(duration), None, handler)
    }

    /// Sleeps `duration` in the first `times` calls before delegating to `handler`; later
    /// calls are delegated at once.
    pub fn sleep_times(times: u32, duration: Duration, handler: H) -> Self {
        Self::new(Fault::Sleep(duration), Some(times), handler)
    }

    /// Applies the fault only to calls for which `predicate` holds (and, with an earlier
    /// `when`, that one too); other calls are delegated and do not count towards `times`.
    ///
    /// The returned handler shares its counters with `self`.
    #[must_use]
    pub fn when(self, predicate: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Self {
        let predicate: Predicate = match self.plan.when.clone() {
            Some(earlier) => Arc::new(move |call: &Call<'_>| earlier(call) && predicate(call)),
            None => Arc::new(predicate),
        };
        Self {
            plan: Arc::new(Plan {
                when: Some(predicate),
                ..(*self.plan).clone()
            }),
            ..self
        }
    }

    /// Applies the fault only to deliveries of object `object_identifier`.
    #[must_use]
    pub fn for_object(self, object_identifier: i64) -> Self {
        self.when(move |call| call.object_identifier == object_identifier)
    }

    /// How many times the handler (or a clone) was called, faults included.
    pub fn calls(&self) -> u32 {
        self.counters.calls.load(Ordering::SeqCst)
    }

    /// How many faults the handler (or a clone) injected: failures, panics or sleeps.
    pub fn injected(&self) -> u32 {
        self.counters.injected.load(Ordering::SeqCst)
    }

    /// The handler faults are not injected into.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// Counts a call and injects the fault if it applies: `Err` for a failure, a panic for a
    /// panic; a sleep returns once slept.
    async fn inject(&self, call: Call<'_>) -> Result<(), BoxError> {
        let number = self.counters.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.plan.when.as_ref().is_some_and(|when| !when(&call)) {
            return Ok(());
        }
        let eligible = self.counters.eligible.fetch_add(1, Ordering::SeqCst);
        if self.plan.times.is_some_and(|times| eligible >= times) {
            return Ok(());
        }
        self.counters.injected.fetch_add(1, Ordering::SeqCst);
        let fault = InjectedFault {
            fault: self.plan.fault,
            number: eligible + 1,
            times: self.plan.times,
            call: number,
            attempt: call.attempt,
            shard: call.shard.clone(),
            object_identifier: call.object_identifier,
        };
        match self.plan.fault {
            Fault::Fail => Err(fault.into()),
            Fault::Panic => panic!("{fault}"),
            Fault::Sleep(duration) => {
                tokio::time::sleep(duration).await;
                Ok(())
            }
        }
    }
}

impl<D: DeliveryKind, H: Handler<D>> Handler<D> for Faulty<H> {
    fn requires(&self, requirements: &mut Requirements) {
        self.inner.requires(requirements);
    }

    async fn call(&self, delivery: D, cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        self.inject(Call {
            shard: delivery.shard(),
            object_identifier: delivery.object_identifier(),
            attempt: delivery.attempt(),
        })
        .await?;
        self.inner.call(delivery, cx).await
    }
}
