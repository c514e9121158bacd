//! Capturing what code under test reports: its metrics (through a recorder that keeps every
//! value, on `metrics-util`'s registry) and its spans and events (through a capturing
//! `tracing` layer), for assertions.
//!
//! [`capture`] runs a future on a runtime of one thread with both installed for that thread
//! only, so tests running beside it in the same process neither see its reports nor add to
//! them. The future gets a [`Probe`] that reads what was reported so far, at any point:
//!
//! ```
//! use outbox_core::Relay;
//! use outbox_core::memory::MemoryStore;
//! use outbox_testkit::fixtures::{OrgUpdate, Recorder, note};
//! use outbox_testkit::telemetry::capture;
//!
//! let ((), telemetry) = capture(|_probe| async {
//!     let store = MemoryStore::new();
//!     store.write(&note::<OrgUpdate>(1, 1, 1));
//!     Relay::new(store, Recorder::new().registry()).drain().await.unwrap();
//! });
//! let labels = [("category", "org_update"), ("scope", "organization")];
//! assert_eq!(telemetry.counter("outbox_deliveries_total", &labels), 1);
//! assert_eq!(telemetry.spans("outbox.deliver").len(), 1);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::MetricKind;
use metrics_util::registry::{AtomicStorage, Registry};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as it was created and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedSpan {
    /// Its name.
    pub name: &'static str,
    /// Its fields, formatted (`Display` for strings, `Debug` otherwise).
    pub fields: BTreeMap<String, String>,
    /// The names of the spans it is inside, innermost first.
    pub parents: Vec<&'static str>,
}

impl CapturedSpan {
    /// The field `name`, formatted.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// An event as it was emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedEvent {
    /// Its level.
    pub level: Level,
    /// Its message.
    pub message: String,
    /// Its other fields, formatted.
    pub fields: BTreeMap<String, String>,
    /// The names of the spans it was emitted in, innermost first.
    pub spans: Vec<&'static str>,
}

impl CapturedEvent {
    /// The field `name`, formatted.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Records {
    /// Spans by id, in creation order (ids may be reused once a span closes).
    spans: Vec<(Id, CapturedSpan)>,
    events: Vec<CapturedEvent>,
}

/// A `tracing` layer that keeps every span and event.
#[derive(Clone, Default)]
pub struct CaptureLayer {
    records: Arc<Mutex<Records>>,
}

impl fmt::Debug for CaptureLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureLayer").finish_non_exhaustive()
    }
}

impl CaptureLayer {
    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Collects fields as formatted strings.
struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CaptureLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parents = ctx
            .span(id)
            .map(|span| span.scope().skip(1).map(|parent| parent.name()).collect())
            .unwrap_or_default();
        self.records().spans.push((
            id.clone(),
            CapturedSpan {
                name: attrs.metadata().name(),
                fields,
                parents,
            },
        ));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut records = self.records();
        if let Some((_, span)) = records.spans.iter_mut().rev().find(|(at, _)| at == id) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name()).collect())
            .unwrap_or_default();
        self.records().events.push(CapturedEvent {
            level: *event.metadata().level(),
            message,
            fields,
            spans,
        });
    }
}

/// A metric as reported: its kind, name and labels (sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricKey {
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its name.
    pub name: String,
    /// Its labels, sorted by key.
    pub labels: Vec<(String, String)>,
}

/// A recorder that keeps every value reported to it, readable at any time.
#[derive(Clone)]
struct Keeping(Arc<Registry<Key, AtomicStorage>>);

impl Recorder for Keeping {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |counter| Counter::from_arc(Arc::clone(counter)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(Arc::clone(gauge)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |histogram| Histogram::from_arc(Arc::clone(histogram)))
    }
}

/// What a [`capture`] saw: read live, so a [`Probe`]'s reading changes as the test goes on.
#[derive(Clone)]
pub struct Telemetry {
    metrics: Keeping,
    layer: CaptureLayer,
}

/// Reads what the code under test reported so far, from inside a [`capture`].
pub type Probe = Telemetry;

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("metrics", &self.metric_keys())
            .finish_non_exhaustive()
    }
}

/// A key's labels, sorted.
fn labels_of(key: &Key) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = key
        .labels()
        .map(|label| (label.key().to_owned(), label.value().to_owned()))
        .collect();
    labels.sort_unstable();
    labels
}

/// The value of the key named `name` with exactly `labels` among `handles`.
fn find<'k, V: 'k>(
    handles: impl IntoIterator<Item = (&'k Key, &'k V)>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'k V> {
    let mut wanted: Vec<(String, String)> = labels
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    wanted.sort_unstable();
    handles
        .into_iter()
        .find(|(key, _)| key.name() == name && labels_of(key) == wanted)
        .map(|(_, value)| value)
}

impl Telemetry {
    /// The counter `name` with exactly `labels` (0 if it was never reported).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let handles = self.metrics.0.get_counter_handles();
        find(&handles, name, labels).map_or(0, |value| value.load(Ordering::Acquire))
    }

    /// The gauge `name` with exactly `labels`, if it was set.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let handles = self.metrics.0.get_gauge_handles();
        find(&handles, name, labels).map(|value| f64::from_bits(value.load(Ordering::Acquire)))
    }

    /// The values recorded in the histogram `name` with exactly `labels`.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let handles = self.metrics.0.get_histogram_handles();
        find(&handles, name, labels).map_or_else(Vec::new, |bucket| bucket.data())
    }

    /// Every metric reported, by name and labels.
    pub fn metric_keys(&self) -> Vec<MetricKey> {
        let registry = &self.metrics.0;
        let entry = |kind| {
            move |key: Key| MetricKey {
                kind,
                name: key.name().to_owned(),
                labels: labels_of(&key),
            }
        };
        let mut keys: Vec<_> = (registry.get_counter_handles().into_keys())
            .map(entry(MetricKind::Counter))
            .chain((registry.get_gauge_handles().into_keys()).map(entry(MetricKind::Gauge)))
            .chain((registry.get_histogram_handles().into_keys()).map(entry(MetricKind::Histogram)))
            .collect();
        keys.sort_unstable_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        keys
    }

    /// The spans named `name`, in creation order.
    pub fn spans(&self, name: &str) -> Vec<CapturedSpan> {
        self.layer
            .records()
            .spans
            .iter()
            .filter(|(_, span)| span.name == name)
            .map(|(_, span)| span.clone())
            .collect()
    }

    /// Every event, in order.
    pub fn events(&self) -> Vec<CapturedEvent> {
        self.layer.records().events.clone()
    }
}

/// Installs [`Silent`] as the global default subscriber, once per process, unless another is.
///
/// Without a global subscriber, `tracing` computes the interest of a callsite that another
/// thread meets first, and the global maximum level, from that thread's default alone (no
/// subscriber: nothing enabled) whenever a single dispatcher is registered: a test's
/// thread-local capture would then miss events at random, as tests run beside it.
fn silence_other_threads() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Silent);
    });
}

/// A subscriber that records nothing but leaves every callsite's interest open
/// (`sometimes`), so that thread-local subscribers decide for their own threads.
struct Silent;

impl Subscriber for Silent {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Runs the future `test` makes (given a [`Probe`]) on a new runtime of one thread, with a
/// metrics recorder and a capturing `tracing` subscriber installed for that thread; returns
/// its output and what it reported.
pub fn capture<F, Fut>(test: F) -> (Fut::Output, Telemetry)
where
    F: FnOnce(Probe) -> Fut,
    Fut: Future,
{
    capture_with(tracing_subscriber::registry(), test)
}

/// [`capture`] with more layers under the capturing one: `subscriber` is a
/// `tracing_subscriber::registry()` with the test's layers (an OpenTelemetry layer, say).
pub fn capture_with<S, F, Fut>(subscriber: S, test: F) -> (Fut::Output, Telemetry)
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static,
    F: FnOnce(Probe) -> Fut,
    Fut: Future,
{
    silence_other_threads();
    let telemetry = Telemetry {
        metrics: Keeping(Arc::new(Registry::atomic())),
        layer: CaptureLayer::default(),
    };
    let subscriber = subscriber.with(telemetry.layer.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the test");
    let probe = telemetry.clone();
    let output = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&telemetry.metrics, || runtime.block_on(test(probe)))
    });
    drop(runtime);
    (output, telemetry)
}
