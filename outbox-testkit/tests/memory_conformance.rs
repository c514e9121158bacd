//! The store and relay part of the conformance suite, on the in-memory store.

outbox_testkit::store_conformance_tests!(outbox_testkit::memory::MemoryBackend);
