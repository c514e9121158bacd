//! Metadata carried with a message from its writer to its handler: the producer's W3C trace
//! context, and entries of the caller's own.

use std::collections::BTreeMap;
use std::fmt;

/// The W3C trace context's `traceparent` key.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C trace context's `tracestate` key.
pub const TRACESTATE: &str = "tracestate";

/// String entries stored with a message (a nullable JSON object column) and handed to its
/// handler in [`Delivery::metadata`](crate::Delivery::metadata).
///
/// With the `opentelemetry` feature, [`Message::new`](crate::Message::new) records the current
/// span's W3C trace context here (`traceparent`, `tracestate`), and the relay links the
/// delivery's span to it. Empty metadata is stored as `NULL` and costs nothing.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    /// No entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entry under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Sets the entry under `key`, returning the value it replaces.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        self.0.insert(key.into(), value.into())
    }

    /// Removes the entry under `key`.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.0.remove(key)
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }

    /// The producer's W3C `traceparent`, if the message carries one.
    pub fn traceparent(&self) -> Option<&str> {
        self.get(TRACEPARENT)
    }

    /// The producer's W3C `tracestate`, if the message carries one.
    pub fn tracestate(&self) -> Option<&str> {
        self.get(TRACESTATE)
    }

    /// The trace id of the producer's `traceparent` (32 lowercase hex digits), if it carries
    /// a well-formed one.
    pub fn trace_id(&self) -> Option<&str> {
        let traceparent = self.traceparent()?;
        let mut parts = traceparent.split('-');
        let (_version, trace_id) = (parts.next()?, parts.next()?);
        (trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(trace_id)
    }

    /// The metadata as stored: a JSON object, or `None` when empty.
    pub fn to_json(&self) -> Option<String> {
        (!self.is_empty())
            .then(|| serde_json::to_string(&self.0).expect("a map of strings serializes to JSON"))
    }

    /// Reads stored metadata: a JSON object of strings.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        Self(
            entries
                .into_iter()
                .map(|(key, value)| (key.into(), value.into()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_as_a_json_object_and_empty_is_none() {
        assert_eq!(Metadata::new().to_json(), None);
        let metadata: Metadata = [
            (
                TRACEPARENT,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("tenant", "acme"),
        ]
        .into_iter()
        .collect();
        let json = metadata.to_json().unwrap();
        assert_eq!(Metadata::from_json(&json).unwrap(), metadata);
        assert_eq!(
            metadata.trace_id(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert!(Metadata::from_json("[1]").is_err());
        assert!(Metadata::from_json(r#"{"a": 1}"#).is_err());
    }

    #[test]
    fn a_malformed_traceparent_has_no_trace_id() {
        for bad in ["", "00", "00-xyz-00f067aa0ba902b7-01", "00-4bf92f35-01"] {
            let metadata: Metadata = [(TRACEPARENT, bad)].into_iter().collect();
            assert_eq!(metadata.trace_id(), None, "{bad}");
        }
    }
}
