//! The backend conformance suite, run against SQLite.

outbox_testkit::conformance_tests!(outbox_testkit::sqlite::SqliteBackend);
