//! The backend conformance suite, run against PostgreSQL.

outbox_testkit::conformance_tests!(outbox_testkit::postgres::PgBackend);
