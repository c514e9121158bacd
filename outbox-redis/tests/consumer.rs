//! The consumer's side against the Redis server on 127.0.0.1:6379, through the consumer suite
//! of `outbox-testkit`: an orders database's relay appends to a stream of the test's own, and
//! billing's `RedisConsumer` applies each entry into billing's own SQLite database through its
//! inbox, effectively once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_redis::{PAYLOAD_FIELD, RedisConsumer, RedisSink};
use outbox_testkit::consumers::ConsumerBroker;
use redis::AsyncCommands;
use redis::streams::StreamInfoGroupsReply;

const REDIS: &str = "redis://127.0.0.1:6379";

/// The stream of one test, `outbox_inbox_<test>_<pid>_<n>:audit_event`; deleted at the end.
struct TestStream {
    prefix: String,
    connection: redis::aio::MultiplexedConnection,
}

impl TestStream {
    async fn create(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "outbox_inbox_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let connection = client()
            .get_multiplexed_async_connection()
            .await
            .expect("Redis runs on 6379");
        Self { prefix, connection }
    }

    fn key(&self) -> String {
        format!("{}:audit_event", self.prefix)
    }
}

fn client() -> redis::Client {
    redis::Client::open(REDIS).expect("a Redis URL")
}

impl ConsumerBroker for TestStream {
    type Sink = RedisSink;

    async fn sink(&self) -> RedisSink {
        RedisSink::connect(client())
            .await
            .expect("Redis runs on 6379")
            .with_key_prefix(&self.prefix)
    }

    async fn publish_raw(&self, headers: &[(&str, &str)], payload: &[u8]) {
        let mut fields: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(name, value)| (*name, value.as_bytes()))
            .collect();
        fields.push((PAYLOAD_FIELD, payload));
        let mut connection = self.connection.clone();
        let _: String = connection
            .xadd(self.key(), "*", &fields)
            .await
            .expect("XADD");
    }

    /// Member `member` of group `group`, claiming what another member left pending for a
    /// second.
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport> {
        let redis = RedisConsumer::new(consumer, self.key(), group, member)
            .claim_after(Duration::from_secs(1));
        Box::pin(async move { redis.run(client(), stop).await.expect("the consumer ran") })
    }

    async fn all_acknowledged(&self, group: &str) -> bool {
        let mut connection = self.connection.clone();
        let groups: StreamInfoGroupsReply = connection
            .xinfo_groups(self.key())
            .await
            .unwrap_or_default();
        groups
            .groups
            .iter()
            .find(|info| info.name == group)
            .is_some_and(|info| info.pending == 0 && info.lag == Some(0))
    }

    async fn remove(self) {
        let mut connection = self.connection.clone();
        let _: () = connection.del(self.key()).await.expect("DEL");
    }
}

outbox_testkit::consumer_suite!(TestStream::create, reports_lag: true);
