//! Prints the orders the publisher sent to NATS JetStream, then stops once none has come
//! for two seconds.
//!
//! `cargo run -p nats-orders --bin consumer -- [--stream NAME] [--url URL]`

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use clap::Parser;
use nats_orders::{Target, consume};
use outbox::BoxError;

/// Prints the orders the publisher sent to NATS JetStream, from the stream's start, then stops
/// once none has come for two seconds.
#[derive(Debug, Parser)]
struct Args {
    /// Where the orders are.
    #[command(flatten)]
    target: Target,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let target = args.target;
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
