//! Prints the orders the publisher sent to NATS JetStream, then stops once none has come
//! for two seconds.
//!
//! `cargo run -p nats-orders --bin consumer -- [--stream NAME] [--url URL]`

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use nats_orders::{Target, consume};
use outbox_core::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut target = Target {
        url: "nats://127.0.0.1:4222".to_owned(),
        stream: "orders".to_owned(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--stream", Some(value)) => target.stream = value,
            ("--url", Some(value)) => target.url = value,
            _ => {}
        }
    }
    let received = consume(&target, Duration::from_secs(2), |one| {
        println!(
            "order {:>4}  {:>6} cents  customer shard {}  message {}",
            one.order.order, one.order.total_cents, one.shard, one.message_id
        );
    })
    .await?;
    println!("{} orders received", received.len());
    Ok(())
}
