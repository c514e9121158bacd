//! The consumer's side against the RabbitMQ server on 127.0.0.1:5672 (guest/guest), through
//! the consumer suite of `outbox-testkit`: an orders database's relay publishes to a topic
//! exchange of the test's own, bound to a queue per consumer group, and billing's
//! `RabbitConsumer` applies each message into billing's own SQLite database through its
//! inbox, effectively once.

use std::sync::atomic::{AtomicU64, Ordering};

use lapin::options::{
    BasicPublishOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_rabbitmq::{RabbitConsumer, RabbitSink};
use outbox_testkit::consumers::ConsumerBroker;

const URI: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The groups the suite consumes as: a queue each, bound to the test's exchange.
const GROUPS: [&str; 2] = ["billing", "billing-again"];

/// A topic exchange of one test, `outbox_inbox_<test>_<pid>_<n>`, and a queue per group
/// bound to all of it; deleted at the end.
struct TestExchange {
    name: String,
    _connection: Connection,
    channel: Channel,
}

impl TestExchange {
    async fn declare(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "outbox_inbox_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let connection = Connection::connect(URI, ConnectionProperties::default())
            .await
            .expect("RabbitMQ runs on 5672");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .exchange_declare(
                ShortString::from(name.as_str()),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the test exchange");
        let exchange = Self {
            name,
            _connection: connection,
            channel,
        };
        for group in GROUPS {
            let queue = exchange.queue(group);
            exchange
                .channel
                .queue_declare(
                    ShortString::from(queue.as_str()),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("declare a group's queue");
            exchange
                .channel
                .queue_bind(
                    ShortString::from(queue.as_str()),
                    ShortString::from(exchange.name.as_str()),
                    ShortString::from("#"),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind a group's queue");
        }
        exchange
    }

    fn queue(&self, group: &str) -> String {
        format!("{}.{group}", self.name)
    }
}

impl ConsumerBroker for TestExchange {
    type Sink = RabbitSink;

    async fn sink(&self) -> RabbitSink {
        RabbitSink::connect(URI)
            .await
            .expect("RabbitMQ runs on 5672")
            .with_exchange(&self.name)
            .with_routing_prefix(&self.name)
    }

    async fn publish_raw(&self, headers: &[(&str, &str)], payload: &[u8]) {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(
                ShortString::from(*name),
                AMQPValue::LongString(LongString::from(*value)),
            );
        }
        self.channel
            .basic_publish(
                ShortString::from(self.name.as_str()),
                ShortString::from(format!("{}.audit_event", self.name)),
                BasicPublishOptions::default(),
                payload,
                BasicProperties::default().with_headers(table),
            )
            .await
            .expect("publish")
            .await
            .expect("published");
    }

    /// The group's queue (RabbitMQ's consumers have no member names).
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        _member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport> {
        let rabbit = RabbitConsumer::new(consumer, self.queue(group));
        Box::pin(async move { rabbit.run(URI, stop).await.expect("the consumer ran") })
    }

    /// No message ready in the group's queue: once its consumer has closed its connection,
    /// what it had not acknowledged is ready again.
    async fn all_acknowledged(&self, group: &str) -> bool {
        let queue = self
            .channel
            .queue_declare(
                ShortString::from(self.queue(group)),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the group's queue");
        queue.message_count() == 0
    }

    async fn remove(self) {
        for group in GROUPS {
            self.channel
                .queue_delete(
                    ShortString::from(self.queue(group)),
                    QueueDeleteOptions::default(),
                )
                .await
                .expect("delete a group's queue");
        }
        self.channel
            .exchange_delete(
                ShortString::from(self.name.as_str()),
                ExchangeDeleteOptions::default(),
            )
            .await
            .expect("delete the test exchange");
    }
}

// The lag is sampled every 5 s: a test's few messages may come and go between two samples.
outbox_testkit::consumer_suite!(TestExchange::declare, reports_lag: false);
