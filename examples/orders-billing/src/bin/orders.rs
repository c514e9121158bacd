//! The orders service: places orders, each with its outbox message, and publishes them to
//! NATS JetStream.
//!
//! `cargo run -p orders-billing --bin orders -- [--orders N] [--customers N] [--database PATH] [--stream NAME] [--url URL]`

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use clap::Parser;
use orders_billing::{Broker, orders_database, place_orders, publish};
use outbox::BoxError;

/// Places orders in the orders database (each with its outbox message, in one transaction)
/// and publishes every pending one to the stream.
#[derive(Debug, Parser)]
struct Args {
    /// How many orders to place.
    #[arg(long, default_value_t = 10)]
    orders: i64,
    /// How many customers place them (one customer's orders are published in order).
    #[arg(long, default_value_t = 3)]
    customers: i64,
    /// The orders database (created if missing). Keep it across runs: the inbox knows
    /// messages by their id, which is unique per outbox database.
    #[arg(long, default_value = "orders.db")]
    database: PathBuf,
    /// Where the orders go.
    #[command(flatten)]
    broker: Broker,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let pool = orders_database(&args.database).await?;
    place_orders(&pool, args.orders, args.customers).await?;
    let published = publish(&pool, &args.broker).await?;
    println!(
        "placed {} orders; JetStream acknowledged {published} messages on stream `{}`",
        args.orders, args.broker.stream
    );
    Ok(())
}
