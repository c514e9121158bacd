//! Writes orders with their outbox on SQLite and publishes them to NATS JetStream.
//!
//! `cargo run -p nats-orders --bin publisher -- [--orders N] [--stream NAME] [--url URL]`

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use nats_orders::{Target, publish};
use outbox_core::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (target, orders) = args();
    let report = publish(&target, orders, 5).await?;
    println!(
        "published {} orders to JetStream stream `{}` ({} rows acknowledged after JetStream's ack)",
        report.deliveries, target.stream, report.rows_acknowledged
    );
    Ok(())
}

fn args() -> (Target, i64) {
    let mut target = Target {
        url: "nats://127.0.0.1:4222".to_owned(),
        stream: "orders".to_owned(),
    };
    let mut orders = 10;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--orders", Some(value)) => orders = value.parse().unwrap_or(orders),
            ("--stream", Some(value)) => target.stream = value,
            ("--url", Some(value)) => target.url = value,
            _ => {}
        }
    }
    (target, orders)
}
