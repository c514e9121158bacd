//! Scenario 4: from commit to handler start, from 16 writers at about 1,000 and 10,000
//! messages/s, each writing through an `OutboxTransaction`: the relay in the writers' process
//! (woken directly after each commit), the relay as another process would be (woken by the
//! `NOTIFY` sent after the commit: its pool names the server by another host name, so the
//! writers' direct wake-ups do not reach it), and a relay that only polls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::store::Store;
use outbox_core::{Delivery, Message, Registry, Relay, RelayConfig};
use outbox_postgres::PgStore;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, Transfer, Transferred, failed};

const WRITERS: u64 = 16;
/// The shards the live messages go to (object % SHARDS).
pub(super) const SHARDS: i64 = 1_000;

/// When each object's message was committed, or its handler started.
pub(super) type Instants = Arc<Mutex<HashMap<i64, Instant>>>;

pub(super) fn note(instants: &Instants, object: i64) {
    instants
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(object, Instant::now());
}

/// Writes one message about `object` (on shard `object % SHARDS`) through an
/// `OutboxTransaction`, and commits it.
pub(super) async fn commit_one(pool: &PgPool, object: i64) -> Result<(), String> {
    let message = live_message(object)?;
    let mut tx = outbox_postgres::begin(pool)
        .await
        .map_err(failed("begin"))?;
    tx.write(&message).await.map_err(failed("write"))?;
    tx.commit().await.map_err(failed("commit"))?;
    Ok(())
}

/// The live message about `object`, on shard `object % SHARDS`.
pub(super) fn live_message(object: i64) -> Result<Message, String> {
    Message::new::<Transferred>(
        object % SHARDS,
        object,
        &Transfer {
            account: object,
            amount: 1,
        },
    )
    .map_err(failed("message"))
}

/// Commits live messages at `rate` from `writers` writers, objects from `first`,
/// until `stop` says so; returns how many.
pub(super) async fn live_traffic(
    pool: &PgPool,
    first: i64,
    committed: &Instants,
    stop: watch::Receiver<bool>,
    rate: u64,
    writers: u64,
) -> Result<i64, String> {
    let commit = |pool: PgPool, object| async move { commit_one(&pool, object).await };
    live_traffic_with(pool, first, committed, stop, rate, writers, commit).await
}

/// [`live_traffic`], each object committed by `commit` (on the writer's pool).
pub(super) async fn live_traffic_with<P, C, F>(
    pool: &P,
    first: i64,
    committed: &Instants,
    mut stop: watch::Receiver<bool>,
    rate: u64,
    writers: u64,
    commit: C,
) -> Result<i64, String>
where
    P: Clone + Send + Sync + 'static,
    C: Fn(P, i64) -> F + Clone + Send + 'static,
    F: Future<Output = Result<(), String>> + Send,
{
    let interval = Duration::from_secs(writers) / rate as u32;
    let begin = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let (pool, committed, stop) = (pool.clone(), Arc::clone(committed), stop.clone());
        let commit = commit.clone();
        tasks.spawn(async move {
            let offset = interval / writers as u32 * writer as u32;
            let mut written = 0i64;
            for i in 0u32.. {
                if *stop.borrow() {
                    break;
                }
                tokio::time::sleep_until(begin + offset + interval * i).await;
                let object = first + i64::from(i) * writers as i64 + writer as i64;
                commit(pool.clone(), object).await?;
                note(&committed, object);
                written += 1;
            }
            Ok::<i64, String>(written)
        });
    }
    let _ = stop.wait_for(|stop| *stop).await;
    let mut written = 0;
    while let Some(done) = tasks.join_next().await {
        written += done.map_err(failed("a live writer"))??;
    }
    Ok(written)
}

/// The percentile `p` (0 to 1) of sorted `values`.
pub(super) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// How the relay hears of commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// In the writers' process: directly.
    Here,
    /// As another process: by the `NOTIFY` after the commit.
    Elsewhere,
    /// Not at all: it polls (10 ms after work, up to 1 s when idle).
    Polling,
}

pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let seconds = args.seconds(20, 3);
    let mut rows = Vec::new();
    for (woken, rate) in [
        (Woken::Here, 1_000),
        (Woken::Here, 10_000),
        (Woken::Elsewhere, 1_000),
        (Woken::Elsewhere, 10_000),
        (Woken::Polling, 1_000),
    ] {
        let latencies = measure(server, seconds, rate, woken).await?;
        let mode = match woken {
            Woken::Here => "relay in the writers' process",
            Woken::Elsewhere => "relay in another process (NOTIFY after commit)",
            Woken::Polling => "poll-only relay (10 ms poll after work, 1 s when idle)",
        };
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        let (p50, p99, max) = (
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies[latencies.len() - 1]),
        );
        let targets = if woken == Woken::Polling {
            [Target::None, Target::None, Target::None]
        } else {
            [Target::Below(1.0), Target::Below(3.5), Target::None]
        };
        for ((what, value), target) in [("p50", p50), ("p99", p99), ("max", max)]
            .into_iter()
            .zip(targets)
        {
            rows.push(Row::measured(
                &format!(
                    "4. latency, commit to handler, {} messages at ~{rate}/s from 16 writers, {mode}: {what}",
                    latencies.len()
                ),
                "ms",
                value,
                target,
            ));
        }
    }
    Ok(rows)
}

/// Commit-to-handler latencies, sorted.
async fn measure(
    server: &Server,
    seconds: Duration,
    rate: u64,
    woken: Woken,
) -> Result<Vec<Duration>, String> {
    let database = server.database(WRITERS as u32 + 2).await?;
    let committed: Instants = Arc::default();
    let started: Instants = Arc::default();
    let registry = noting_registry(&started)?;
    let config = RelayConfig::builder()
        .wake_on_commit(woken != Woken::Polling)
        .build()
        .map_err(failed("the relay configuration"))?;
    let mut options = (*database.pool.connect_options()).clone();
    if woken == Woken::Elsewhere {
        // Another name for the same server: this process's direct wake-ups are keyed by the
        // name the writers use, and do not reach this relay.
        let other = if options.get_host() == "localhost" {
            "127.0.0.1"
        } else {
            "localhost"
        };
        options = options.host(other);
    }
    let relay_pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .map_err(failed("connecting the relay"))?;
    let relay = Relay::with_config(PgStore::new(relay_pool), registry, config);
    let (stop, running) = run_relay(&relay);
    // Let the relay start listening, then warm it up with one message: the figures are the
    // steady state's (a relay idle since its start polls at its poll interval, 1 s, at worst).
    tokio::time::sleep(Duration::from_millis(500)).await;
    commit_one(&database.pool, -1).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while started
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&-1)
        .is_none()
    {
        if Instant::now() > deadline {
            return Err("the relay did not deliver the warm-up message within 10 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let per_writer = seconds.as_secs() * rate / WRITERS;
    let interval = Duration::from_secs(WRITERS) / rate as u32;
    let begin = tokio::time::Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (pool, committed) = (database.pool.clone(), Arc::clone(&committed));
        writers.spawn(async move {
            let offset = interval / WRITERS as u32 * writer as u32;
            for i in 0..per_writer {
                tokio::time::sleep_until(begin + offset + interval * i as u32).await;
                let object = (writer * per_writer + i) as i64;
                commit_one(&pool, object).await?;
                note(&committed, object);
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done.map_err(failed("a writer"))??;
    }
    let total = (WRITERS * per_writer) as usize;
    delivered(&started, total, Duration::from_secs(10)).await?;
    stopped(stop, running).await?;
    database.drop_database().await?;

    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    let started = started.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(latencies(&committed, &started, i64::MIN..i64::MAX))
}

/// The handler of the live messages: notes when each started.
pub(super) fn noting(
    started: &Instants,
) -> impl Fn(Delivery<Transferred>) -> std::future::Ready<Result<(), std::io::Error>>
+ Clone
+ Send
+ Sync
+ 'static {
    let started = Arc::clone(started);
    move |delivery: Delivery<Transferred>| {
        note(
            &started,
            i64::try_from(delivery.object_identifier).unwrap_or(-1),
        );
        std::future::ready(Ok(()))
    }
}

/// Waits until `total` messages have started their handler, failing after `within`.
pub(super) async fn delivered(
    started: &Instants,
    total: usize,
    within: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while started.lock().unwrap_or_else(PoisonError::into_inner).len() < total {
        if Instant::now() > deadline {
            return Err(format!(
                "the relay did not deliver every message within {} s",
                within.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Stops a relay [`run_relay`] started, and waits for it.
pub(super) async fn stopped(
    stop: watch::Sender<bool>,
    running: tokio::task::JoinHandle<Result<outbox_core::RunReport, outbox_core::Error>>,
) -> Result<(), String> {
    let _ = stop.send(true);
    running
        .await
        .map_err(failed("the relay task"))?
        .map_err(failed("the relay"))?;
    Ok(())
}

/// Starts [`live_traffic`] in a task, until the returned sender says stop.
pub(super) fn start_live(
    pool: &PgPool,
    committed: &Instants,
    rate: u64,
    writers: u64,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<i64, String>>,
) {
    let (stop, stopped) = watch::channel(false);
    let (pool, committed) = (pool.clone(), Arc::clone(committed));
    let live =
        tokio::spawn(
            async move { live_traffic(&pool, 0, &committed, stopped, rate, writers).await },
        );
    (stop, live)
}

/// A registry of the live messages' category alone, whose handler is [`noting`].
pub(super) fn noting_registry(started: &Instants) -> Result<Registry, String> {
    Registry::builder()
        .handle::<Transferred>(noting(started))
        .build()
        .map_err(failed("the registry"))
}

/// Runs `relay` in a task until the returned sender says stop.
pub(super) fn run_relay<S: Store>(
    relay: &Relay<S>,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<outbox_core::RunReport, outbox_core::Error>>,
) {
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            let mut stopped = stopped;
            relay
                .run(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                })
                .await
        }
    });
    (stop, running)
}

/// The commit-to-handler latencies of the objects in `objects`, sorted (`Duration::MAX` for a
/// message never delivered).
pub(super) fn latencies(
    committed: &HashMap<i64, Instant>,
    started: &HashMap<i64, Instant>,
    objects: std::ops::Range<i64>,
) -> Vec<Duration> {
    latencies_where(committed, started, |object, _| objects.contains(object))
}

/// The commit-to-handler latencies of the objects `keep` takes (by object and commit time),
/// sorted (`Duration::MAX` for a message never delivered).
pub(super) fn latencies_where(
    committed: &HashMap<i64, Instant>,
    started: &HashMap<i64, Instant>,
    keep: impl Fn(&i64, &Instant) -> bool,
) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = committed
        .iter()
        .filter(|(object, at)| keep(object, at))
        .map(|(object, at)| {
            started
                .get(object)
                .map_or(Duration::MAX, |began| began.saturating_duration_since(*at))
        })
        .collect();
    latencies.sort_unstable();
    latencies
}
