//! The example end to end against the local NATS server (JetStream on 127.0.0.1:4222), on a
//! stream of its own that it deletes.

use std::collections::BTreeMap;
use std::time::Duration;

use nats_orders::{Target, consume, publish};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_receives_every_order_in_order_per_customer() {
    let target = Target {
        url: "nats://127.0.0.1:4222".to_owned(),
        stream: format!("outbox_example_{}", std::process::id()),
    };
    let published = publish(&target, 30, 4).await.expect("publish the orders");
    assert!(published.is_complete(), "{published:?}");
    assert_eq!(published.deliveries, 30);
    assert_eq!(published.stored, 30);

    let received = consume(&target, Duration::from_secs(2), |_| {})
        .await
        .expect("consume the orders");
    let mut by_customer: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for one in &received {
        by_customer
            .entry(one.shard.clone())
            .or_default()
            .push(one.order.order);
    }
    assert_eq!(received.len(), 30, "{received:?}");
    assert_eq!(by_customer.len(), 4);
    for (customer, orders) in &by_customer {
        let mut sorted = orders.clone();
        sorted.sort_unstable();
        assert_eq!(orders, &sorted, "customer {customer}'s orders in order");
    }
    target
        .delete_stream()
        .await
        .expect("delete the example stream");
}
