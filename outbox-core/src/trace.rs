//! The producer's trace context, carried through the outbox (behind the `opentelemetry`
//! feature; without it, nothing is recorded and nothing costs).

use crate::metadata::Metadata;

/// The metadata a new message starts with: the current span's W3C trace context, with the
/// `opentelemetry` feature and a sampled or recorded span; nothing otherwise.
#[cfg(not(feature = "opentelemetry"))]
#[inline]
pub(crate) fn current_metadata() -> Metadata {
    Metadata::new()
}

/// The metadata a new message starts with: the current span's W3C trace context, when the
/// current span has a valid OpenTelemetry context.
#[cfg(feature = "opentelemetry")]
pub(crate) fn current_metadata() -> Metadata {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let mut metadata = Metadata::new();
    let context = tracing::Span::current().context();
    if context.span().span_context().is_valid() {
        opentelemetry::propagation::TextMapPropagator::inject_context(
            &opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            &context,
            &mut Carrier(&mut metadata),
        );
    }
    metadata
}

/// Relates a delivery's span to the producer's trace context in `metadata`: as a link, or as
/// its parent.
#[cfg(feature = "opentelemetry")]
pub(crate) fn relate(span: &tracing::Span, metadata: &Metadata, relation: TraceRelation) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    if metadata.traceparent().is_none() {
        return;
    }
    let context = opentelemetry::propagation::TextMapPropagator::extract(
        &opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        &Reader(metadata),
    );
    let producer = context.span().span_context().clone();
    if !producer.is_valid() {
        return;
    }
    match relation {
        TraceRelation::Link => span.add_link(producer),
        TraceRelation::Child => {
            // A span's parent can be set only before it is first entered: the relay calls
            // this on a span it has just created.
            let _ = span.set_parent(context);
        }
    }
}

/// How a delivery's span relates to the trace of the request that wrote its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TraceRelation {
    /// The delivery span starts a trace of its own, linked to the producer's span (the
    /// OpenTelemetry convention for messaging consumers: a delivery may come long after, and
    /// a coalesced group has several producers).
    #[default]
    Link,
    /// The delivery span is a child of the producer's span: one trace from request to handler.
    Child,
}

/// The metadata as the propagator's carrier.
#[cfg(feature = "opentelemetry")]
struct Carrier<'a>(&'a mut Metadata);

#[cfg(feature = "opentelemetry")]
impl opentelemetry::propagation::Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value);
    }
}

/// The metadata as the propagator reads it.
#[cfg(feature = "opentelemetry")]
struct Reader<'a>(&'a Metadata);

#[cfg(feature = "opentelemetry")]
impl opentelemetry::propagation::Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(key, _)| key).collect()
    }
}
