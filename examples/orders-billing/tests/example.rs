//! The example end to end against the local NATS server (JetStream on 127.0.0.1:4222), on a
//! stream of its own that it deletes: every order charged once, also when billing reads the
//! whole stream again.

use std::time::Duration;

use orders_billing::{
    Broker, billing_database, charge, charges, orders_database, place_orders, publish,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_exactly_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = Broker {
        url: "nats://127.0.0.1:4222".to_owned(),
        stream: format!("outbox_orders_billing_{}", std::process::id()),
    };
    let orders = orders_database(&dir.path().join("orders.db"))
        .await
        .expect("the orders database");
    let billing = billing_database(&dir.path().join("billing.db"))
        .await
        .expect("the billing database");

    place_orders(&orders, 30, 4).await.expect("place orders");
    assert_eq!(publish(&orders, &broker).await.expect("publish"), 30);
    let idle = Duration::from_millis(500);
    let report = charge(&billing, &broker, "billing", idle)
        .await
        .expect("charge");
    assert_eq!((report.applied, report.duplicates), (30, 0));

    // More orders: the durable consumer goes on where it stopped.
    place_orders(&orders, 5, 4).await.expect("place orders");
    assert_eq!(publish(&orders, &broker).await.expect("publish"), 5);
    let report = charge(&billing, &broker, "billing", idle)
        .await
        .expect("charge");
    assert_eq!((report.applied, report.duplicates), (5, 0));

    // The whole stream again, through another durable consumer: all of it in the inbox.
    let report = charge(&billing, &broker, "billing-replay", idle)
        .await
        .expect("charge");
    assert_eq!((report.applied, report.duplicates), (0, 35));

    let charged = charges(&billing).await.expect("charges");
    let mut orders: Vec<i64> = charged.iter().map(|(order, _)| *order).collect();
    orders.sort_unstable();
    assert_eq!(orders.len(), 35, "{charged:?}");
    orders.dedup();
    assert_eq!(orders.len(), 35, "no order charged twice");
    broker.delete_stream().await.expect("delete the stream");
}
