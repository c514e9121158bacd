//! The in-memory store as a conformance backend: what proves
//! [`MemoryStore`] against the same store and relay behaviours as the SQL backends.

use outbox_core::memory::MemoryStore;
use outbox_core::{CategoryId, Error, Message, MessageId, ShardKey, WrittenShards};

use crate::backend::StoreBackend;

/// A fresh [`MemoryStore`] for each conformance test (see
/// [`store_conformance_tests!`](crate::store_conformance_tests)).
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    store: MemoryStore,
}

impl MemoryBackend {
    /// The store.
    pub fn memory_store(&self) -> &MemoryStore {
        &self.store
    }
}

impl StoreBackend for MemoryBackend {
    type Store = MemoryStore;

    const NAME: &'static str = "memory";

    async fn create() -> Self {
        Self::default()
    }

    fn store(&self) -> MemoryStore {
        self.store.clone()
    }

    /// The same store: in one process there are no connections to keep apart.
    async fn connect_store(&self) -> MemoryStore {
        self.store.clone()
    }

    async fn write(&self, messages: &[Message]) -> Result<Vec<MessageId>, Error> {
        Ok(self.store.write_all(messages))
    }

    async fn commit(&self, messages: &[Message]) -> Result<WrittenShards, Error> {
        let ids = self.store.write_all(messages);
        let mut written = WrittenShards::new();
        written.record_all(messages, &ids);
        Ok(written)
    }

    async fn insert_raw(
        &self,
        shard: &ShardKey,
        category: i32,
        object_identifier: outbox_core::Id,
        payload_json: &str,
    ) -> MessageId {
        self.store
            .insert_raw(shard, CategoryId(category), object_identifier, payload_json)
    }
}
