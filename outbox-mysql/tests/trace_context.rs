//! The producer's trace context carried to the handler through OpenTelemetry, on MariaDB.

#[test]
fn trace_context_reaches_the_handler() {
    outbox_testkit::conformance::trace_context_reaches_the_handler::<
        outbox_testkit::mysql::MySqlBackend,
    >();
}

#[test]
fn the_consumers_span_is_linked_to_the_producers() {
    outbox_testkit::conformance::the_consumers_span_is_linked_to_the_producers::<
        outbox_testkit::mysql::MySqlBackend,
    >();
}
