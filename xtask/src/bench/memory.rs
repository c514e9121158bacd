//! Scenario 5: the relay's peak resident memory while draining scenario 2's backlog, and a
//! backlog ten times larger. The relay runs in a child process of its own (this binary, a
//! hidden subcommand), so that its peak is not the seeding's or the benchmark's.

use std::process::Command;
use std::time::{Duration, Instant};

use outbox_core::RelayConfig;
use outbox_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;

use super::BenchArgs;
use super::drain::{counting_relay, seed_pg};
use super::report::{Row, Target};
use super::setup::{Server, failed};

pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let shards = args.sized(10_000, 100);
    let mut rows = Vec::new();
    for (backlog, limit) in [
        (args.sized(1_000_000, 10_000), None),
        (args.sized(10_000_000, 100_000), Some(args.seconds(60, 10))),
    ] {
        let database = server.database(4).await?;
        seed_pg(&database.pool, backlog, shards, 0).await?;
        let exe = std::env::current_exe().map_err(failed("finding this binary"))?;
        let mut command = Command::new(exe);
        command.args(["bench-memory-child", "--database-url", &database.url()]);
        if let Some(limit) = limit {
            command.args(["--seconds", &limit.as_secs().to_string()]);
        }
        let output = command
            .output()
            .map_err(failed("running the relay process"))?;
        database.drop_database().await?;
        if !output.status.success() {
            return Err(format!(
                "the relay process failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let field = |name: &str| {
            stdout
                .split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .and_then(|value| value.parse::<f64>().ok())
                .ok_or_else(|| format!("the relay process did not report {name}: {stdout}"))
        };
        let (peak, drained, seconds) =
            (field("peak_rss_kib")?, field("drained")?, field("seconds")?);
        let how = match limit {
            None => format!("all {drained} messages in {seconds:.0} s"),
            Some(_) => format!("{drained} messages in the first {seconds:.0} s"),
        };
        rows.push(Row::measured(
            &format!("5. relay peak RSS, backlog of {backlog} messages ({how})"),
            "MiB",
            peak / 1024.0,
            Target::Below(100.0),
        ));
    }
    Ok(rows)
}

/// The child: drains the database at `url` (for at most `seconds`), then prints its peak
/// resident memory (`VmHWM`), the rows it drained and the time it took.
pub(crate) async fn child(url: &str, seconds: Option<u64>) -> Result<String, String> {
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(url)
        .await
        .map_err(failed("connecting"))?;
    let (relay, calls) = counting_relay(PgStore::new(pool), RelayConfig::default());
    let started = Instant::now();
    match seconds {
        None => {
            relay.drain().await.map_err(failed("draining"))?;
        }
        Some(seconds) => {
            // Cut short: what matters is the memory a large backlog costs, not emptying it.
            let limit = Duration::from_secs(seconds);
            if let Ok(report) = tokio::time::timeout(limit, relay.drain()).await {
                report.map_err(failed("draining"))?;
            }
        }
    }
    // One handler call per message: no message of the backlog coalesces.
    let drained = calls.load(std::sync::atomic::Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(failed("reading /proc/self/status"))?;
    let peak = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .ok_or("no VmHWM in /proc/self/status")?;
    Ok(format!(
        "peak_rss_kib={peak} drained={drained} seconds={elapsed:.1}"
    ))
}
