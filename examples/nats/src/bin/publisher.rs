//! Writes orders with their outbox on SQLite and publishes them to NATS JetStream.
//!
//! `cargo run -p nats-orders --bin publisher -- [--orders N] [--customers N] [--stream NAME] [--url URL]`

// An example program reports what it does on stdout, and what went wrong on stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::Parser;
use nats_orders::{Target, publish};
use outbox::BoxError;
use outbox::error::error_chain;

/// Writes orders with their outbox on SQLite (a new database in a temporary directory at each
/// run) and publishes them to NATS JetStream, each deleted once JetStream acknowledged it.
#[derive(Debug, Parser)]
struct Args {
    /// How many orders to write and publish.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    orders: u32,
    /// How many customers place them (one customer's orders are published in order).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    customers: u32,
    /// Where the orders are.
    #[command(flatten)]
    target: Target,
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args = Args::parse();
    let target = args.target;
    let published = publish(&target, args.orders, args.customers).await?;
    println!(
        "wrote orders {} to {}; JetStream acknowledged {} of their {} messages ({} rows \
         deleted after its ack) and stream `{}` stored {} new messages",
        published.orders.start(),
        published.orders.end(),
        published.deliveries,
        published.written(),
        published.rows_acknowledged,
        target.stream,
        published.stored,
    );
    if published.is_complete() {
        return Ok(ExitCode::SUCCESS);
    }
    let unpublished = published.written() - published.rows_acknowledged;
    if unpublished > 0 {
        eprintln!(
            "{unpublished} orders were not published, and are lost with this run's temporary \
             database:"
        );
        for failure in &published.last_drain.failures {
            eprintln!("  shard {}: {}", failure.shard, error_chain(&failure.error));
        }
        for waiting in &published.last_drain.unavailable {
            eprintln!(
                "  shard {}: {} did not answer",
                waiting.shard,
                waiting.breaker.name()
            );
        }
    }
    if published.stored < published.deliveries {
        eprintln!(
            "JetStream stored {} of the {} messages it acknowledged: it dropped the others as \
             duplicates of message ids it saw within the stream's duplicate window",
            published.stored, published.deliveries
        );
    }
    Ok(ExitCode::FAILURE)
}
