//! The example service end to end: the built binary on a fresh PostgreSQL database, probed,
//! given an order, stopped with SIGTERM; and its probes while the database is gone.

mod common;

use std::time::{Duration, Instant};

use common::Service;
use outbox::testkit::postgres::PgTestDatabase;

#[tokio::test(flavor = "multi_thread")]
async fn serves_probes_delivers_orders_and_stops_on_sigterm() {
    let database = PgTestDatabase::create().await;
    let service = Service::start(&database.url(), &[]);
    let ready = service.wait_for("/readyz", 200).await;
    assert_eq!(ready["ready"], true, "{ready}");

    let (status, created) = service
        .request_json("POST", "/orders", r#"{"total_cents": 1250}"#)
        .expect("POST /orders");
    assert_eq!(status, 201, "{created}");
    let order = created["id"].as_i64().expect("the order's id");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shipped: Option<(i64,)> =
            sqlx::query_as("SELECT total_cents FROM shipments WHERE order_id = $1")
                .bind(order)
                .fetch_optional(database.pool())
                .await
                .expect("read shipments");
        if let Some((total,)) = shipped {
            assert_eq!(total, 1250);
            break;
        }
        assert!(Instant::now() < deadline, "the order was not shipped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The shipment commits before the relay records its acknowledgement: wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = service.wait_for("/healthz", 200).await;
        if live["last_ack_at"].is_number() {
            break;
        }
        assert!(Instant::now() < deadline, "no acknowledgement: {live}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, took) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
    assert!(took < Duration::from_secs(10), "stopped in {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_its_database_it_is_live_but_not_ready() {
    let database = PgTestDatabase::create().await;
    let service = Service::start(&database.url(), &[]);
    service.wait_for("/readyz", 200).await;
    // Ready means past the relay's start-up checks; an order delivered shows it at work.
    let (status, created) = service
        .request_json("POST", "/orders", r#"{"total_cents": 1250}"#)
        .expect("POST /orders");
    assert_eq!(status, 201, "{created}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !service.wait_for("/healthz", 200).await["last_ack_at"].is_number() {
        assert!(Instant::now() < deadline, "the order was not delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The database goes away (dropped, its connections terminated).
    drop(database);
    let not_ready = service.wait_for("/readyz", 503).await;
    assert_eq!(not_ready["database_reachable"], false, "{not_ready}");
    let live = service.wait_for("/healthz", 200).await;
    assert_eq!(live["live"], true, "{live}");
    let (status, _) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
}
