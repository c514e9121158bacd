//! Scenario 8: what reporting metrics costs. The write path (scenario 1) and the drain
//! (scenario 2) with a Prometheus recorder installed, against the same work with none, in the
//! same run, interleaved. The recorder is switched, not reinstalled (a process installs one
//! recorder once): switched off, every metric gets a no-op handle, as with no recorder.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use super::BenchArgs;
use super::drain::{relay_pg, seed_pg};
use super::report::{Row, Target};
use super::setup::{Server, failed};
use super::write::{Side, accounts_pg, compare, one_message_pg, truncate_pg};

/// A Prometheus recorder that reports only while switched on.
#[derive(Clone)]
struct Switched {
    on: Arc<AtomicBool>,
    recorder: Arc<PrometheusRecorder>,
}

impl Recorder for Switched {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.recorder.describe_counter(key, unit, text);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.recorder.describe_gauge(key, unit, text);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.recorder.describe_histogram(key, unit, text);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.recorder.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.recorder.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.recorder.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// The switch of the process's recorder, installed at its first use.
fn switch() -> Result<(&'static AtomicBool, PrometheusHandle), String> {
    static INSTALLED: std::sync::OnceLock<(Arc<AtomicBool>, PrometheusHandle)> =
        std::sync::OnceLock::new();
    if let Some((on, handle)) = INSTALLED.get() {
        return Ok((on, handle.clone()));
    }
    let recorder = PrometheusBuilder::new()
        .set_buckets(&[
            0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
        ])
        .map_err(failed("the histogram buckets"))?
        .build_recorder();
    let handle = recorder.handle();
    let on = Arc::new(AtomicBool::new(false));
    metrics::set_global_recorder(Switched {
        on: Arc::clone(&on),
        recorder: Arc::new(recorder),
    })
    .map_err(|error| format!("installing the metrics recorder: {error}"))?;
    outbox_core::telemetry::describe();
    let (on, handle) = INSTALLED.get_or_init(|| (on, handle));
    Ok((on, handle.clone()))
}

/// Runs `run` with the recorder switched off (the baseline side) and on (the engine side),
/// in [`compare`]'s order: the best rate of each side, as `(with the recorder, without)`.
async fn with_and_without<F, Fut>(
    on: &AtomicBool,
    operations: u64,
    mut run: F,
) -> Result<(f64, f64), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<f64, String>>,
{
    let rates = compare(operations, |side| {
        on.store(side == Side::Engine, Ordering::Relaxed);
        let running = run();
        async move { running.await.map(Duration::from_secs_f64) }
    })
    .await;
    on.store(false, Ordering::Relaxed);
    rates
}

/// Scenario 8 on PostgreSQL.
pub(crate) async fn postgres(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (on, handle) = switch()?;
    let workers = 8u64;
    let database = server.database(20).await?;
    let pool = database.pool.clone();
    accounts_pg(&pool).await?;
    let transactions = args.sized(40_000, 400) / workers * workers;
    let (write_on, write_off) = with_and_without(on, transactions, || {
        let pool = pool.clone();
        async move {
            let elapsed =
                one_message_pg(pool, Side::Engine, workers, transactions / workers).await?;
            Ok(elapsed.as_secs_f64())
        }
    })
    .await?;

    let (messages, shards) = (args.sized(1_000_000, 10_000), args.sized(10_000, 100));
    let (drain_on, drain_off) = with_and_without(on, messages, || async {
        truncate_pg(&pool).await?;
        seed_pg(&pool, messages, shards, 0).await?;
        let (rows, _, seconds) = relay_pg(&pool).await?;
        if rows != messages {
            return Err(format!("drained {rows} rows of {messages}"));
        }
        Ok(seconds)
    })
    .await?;
    database.drop_database().await?;
    let scraped = handle.render();
    for name in [
        outbox_core::telemetry::MESSAGES_WRITTEN,
        outbox_core::telemetry::DELIVERIES,
    ] {
        if !scraped.contains(name) {
            return Err(format!("the recorder never received {name}"));
        }
    }
    Ok(vec![
        Row::compared(
            "8. metrics: write (scenario 1) with a Prometheus recorder vs none",
            "transactions/s",
            write_on,
            write_off,
            Target::Ratio(0.97),
        ),
        Row::compared(
            &format!(
                "8. metrics: drain (scenario 2, {messages} messages) with a Prometheus \
                 recorder vs none"
            ),
            "messages/s",
            drain_on,
            drain_off,
            Target::Ratio(0.97),
        ),
    ])
}
