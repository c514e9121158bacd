//! S13 at its edge on MariaDB: a row with a lower id that commits after the relay read its
//! group survives that group's acknowledgement (`outbox_testkit::commit_order`).

outbox_testkit::commit_order_tests!(outbox_testkit::mysql::MySqlDatabase);
