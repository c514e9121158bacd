//! The billing service: charges each order of the stream once, in its own database, through
//! its inbox.
//!
//! `cargo run -p orders-billing --bin billing -- [--database PATH] [--durable NAME] [--idle-seconds N] [--stream NAME] [--url URL]`

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use orders_billing::{Broker, billing_database, charge, charges};
use outbox::BoxError;

/// Charges what the stream holds for billing's durable consumer, until no order came for a
/// while.
#[derive(Debug, Parser)]
struct Args {
    /// The billing database (created if missing).
    #[arg(long, default_value = "billing.db")]
    database: PathBuf,
    /// The durable consumer: another name reads the stream from its start again, and the
    /// inbox charges nothing twice.
    #[arg(long, default_value = "billing")]
    durable: String,
    /// Stop once no order came for this many seconds.
    #[arg(long, default_value_t = 2)]
    idle_seconds: u64,
    /// Where the orders come from.
    #[command(flatten)]
    broker: Broker,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let pool = billing_database(&args.database).await?;
    let report = charge(
        &pool,
        &args.broker,
        &args.durable,
        Duration::from_secs(args.idle_seconds),
    )
    .await?;
    let charged = charges(&pool).await?;
    println!(
        "charged {} orders now, {} delivered again and skipped, {} dead letters; {} charges in \
         all, {} cents",
        report.applied,
        report.duplicates,
        report.dead_lettered,
        charged.len(),
        charged.iter().map(|(_, cents)| cents).sum::<i64>()
    );
    Ok(())
}
