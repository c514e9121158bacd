//! The backend conformance suite, run against MariaDB.

outbox_testkit::conformance_tests!(outbox_testkit::mysql::MySqlBackend);
