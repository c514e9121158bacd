//! The producer's trace context carried to the handler through OpenTelemetry, on PostgreSQL.

#[test]
fn trace_context_reaches_the_handler() {
    outbox_testkit::conformance::trace_context_reaches_the_handler::<
        outbox_testkit::postgres::PgBackend,
    >();
}
