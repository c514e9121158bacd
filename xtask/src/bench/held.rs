//! Scenarios 13c and 13d: a held horizon on MariaDB and on SQLite. Live messages from four
//! writers while another connection holds a transaction that has read the outbox's tables
//! (as a dump or a report does), for three minutes, then the two minutes after it ends.
//!
//! - *MariaDB* (a private server in a temporary directory, InnoDB at its defaults): a
//!   `REPEATABLE READ` transaction `WITH CONSISTENT SNAPSHOT` keeps purge from removing any row
//!   deleted after it began. Each acknowledged message stays delete-marked in its indexes, and
//!   InnoDB's history list grows until the transaction ends. Its gauges: the history list's
//!   length and the outbox tables' tablespaces (allocated on disk).
//! - *SQLite* (a file in a temporary directory, opened by [`outbox_sqlite::connect`]): a
//!   reader whose transaction has read the outbox keeps checkpoints from passing its snapshot,
//!   so the write-ahead log grows with every commit until it ends. Its gauges: the sizes of the
//!   log and of the database file.
//!
//! Each phase (before; each minute of the hold; after) reports the relay's live latency
//! (commit to handler), its delivered share of what was offered, and the gauges at its end.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::store::Store;
use outbox_core::{Relay, RelayConfig};
use sqlx::{Connection, MySqlPool, SqliteConnection, SqlitePool};

use super::BenchArgs;
use super::horizon::{figures, ratio};
use super::latency::{
    Instants, delivered, live_message, live_traffic_with, noting_registry, percentile, run_relay,
    stopped,
};
use super::report::{Row, Target};
use super::setup::failed;
use crate::chaos::mariadb::MariaDb;

/// Live messages a second.
const RATE: u64 = 800;

/// Writers.
const WRITERS: u64 = 4;

/// Minutes the horizon is held.
const MINUTES: u64 = 3;

/// One gauge's reading: its name, unit and value.
type Gauge = (&'static str, &'static str, f64);

/// A stretch of the run, and the gauges at its end.
struct Phase {
    name: String,
    from: Instant,
    to: Instant,
    gauges: Vec<Gauge>,
}

/// Scenario 13c: MariaDB.
pub(crate) async fn mariadb(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let server = MariaDb::start()?;
    let pool = outbox_mysql::connect(&server.url())
        .await
        .map_err(failed("connecting to the private MariaDB server"))?;
    outbox_mysql::migrate(&pool)
        .await
        .map_err(failed("migrating"))?;
    let commit = |pool: MySqlPool, object| async move {
        let message = live_message(object)?;
        let mut tx = outbox_mysql::begin(&pool).await.map_err(failed("begin"))?;
        tx.write(&message).await.map_err(failed("write"))?;
        tx.commit().await.map_err(failed("commit"))?;
        Ok(())
    };
    let gauges = |pool: MySqlPool| async move { innodb(&pool).await };
    let mut holder = sqlx::MySqlConnection::connect(&server.url())
        .await
        .map_err(failed("connecting the long transaction"))?;
    drive(
        args,
        "13c. held horizon on MariaDB (3 min), ~800/s live",
        &pool,
        outbox_mysql::MySqlStore::new(pool.clone()),
        commit,
        gauges,
        &mut holder,
        &[
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "START TRANSACTION WITH CONSISTENT SNAPSHOT",
            "SELECT count(*) FROM outbox_messages",
            "SELECT count(*) FROM outbox_shards",
        ],
    )
    .await
}

/// Scenario 13d: SQLite.
pub(crate) async fn sqlite(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let dir = tempfile::tempdir().map_err(failed("creating a temporary directory"))?;
    let path = dir.path().join("outbox.db");
    let pool = outbox_sqlite::connect(&path)
        .await
        .map_err(failed("opening the database"))?;
    outbox_sqlite::migrate(&pool)
        .await
        .map_err(failed("migrating"))?;
    let commit = |pool: SqlitePool, object| async move {
        let message = live_message(object)?;
        let mut tx = outbox_sqlite::begin(&pool).await.map_err(failed("begin"))?;
        tx.write(&message).await.map_err(failed("write"))?;
        tx.commit().await.map_err(failed("commit"))?;
        Ok(())
    };
    let file = path.clone();
    let gauges = move |_: SqlitePool| {
        let file = file.clone();
        async move { Ok(files(&file)) }
    };
    let mut holder = SqliteConnection::connect_with(&outbox_sqlite::connect_options(&path))
        .await
        .map_err(failed("opening the reader"))?;
    drive(
        args,
        "13d. held horizon on SQLite (3 min), ~800/s live",
        &pool,
        outbox_sqlite::SqliteStore::new(pool.clone()),
        commit,
        gauges,
        &mut holder,
        &[
            "BEGIN",
            "SELECT count(*) FROM outbox_messages",
            "SELECT count(*) FROM outbox_shards",
        ],
    )
    .await
}

/// The scenario on one database: the relay runs on `store` with the registry that notes each
/// handler's start, `commit` writes one live message, `gauges` reads the phase's gauges, and
/// `holder` holds the horizon from its `begin` statements to its `COMMIT`.
#[allow(clippy::too_many_arguments)]
async fn drive<P, S, C, CF, G, GF, H>(
    args: &BenchArgs,
    title: &str,
    pool: &P,
    store: S,
    commit: C,
    gauges: G,
    holder: &mut H,
    begin: &[&'static str],
) -> Result<Vec<Row>, String>
where
    P: Clone + Send + Sync + 'static,
    S: Store,
    C: Fn(P, i64) -> CF + Clone + Send + 'static,
    CF: Future<Output = Result<(), String>> + Send,
    G: Fn(P) -> GF,
    GF: Future<Output = Result<Vec<Gauge>, String>>,
    H: Connection,
    for<'c> &'c mut H: sqlx::Executor<'c, Database = H::Database>,
{
    let (quiet, minute, after) = (
        args.seconds(30, 3),
        args.seconds(60, 2),
        args.seconds(120, 4),
    );
    let (committed, started): (Instants, Instants) = Default::default();
    let relay = Relay::with_config(store, noting_registry(&started)?, RelayConfig::default());
    let (stop_relay, running) = run_relay(&relay);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (stop_live, live) = {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (pool, committed) = (pool.clone(), Arc::clone(&committed));
        let live = tokio::spawn(async move {
            live_traffic_with(&pool, 0, &committed, stopped, RATE, WRITERS, commit).await
        });
        (stop, live)
    };

    let mut phases = Vec::new();
    let mut from = Instant::now();
    let mut end_phase = async |name: String, from: &mut Instant| {
        let to = Instant::now();
        let gauges = gauges(pool.clone()).await?;
        let shown: Vec<String> = gauges
            .iter()
            .map(|(name, unit, value)| format!("{name} {value:.1} {unit}"))
            .collect();
        eprintln!("  {name}: {}", shown.join("; "));
        phases.push(Phase {
            name,
            from: *from,
            to,
            gauges,
        });
        *from = to;
        Ok::<(), String>(())
    };
    tokio::time::sleep(quiet).await;
    end_phase("before".to_owned(), &mut from).await?;

    for statement in begin.iter().copied() {
        sqlx::raw_sql(statement)
            .execute(&mut *holder)
            .await
            .map_err(failed("beginning the hold"))?;
    }
    for held in 1..=MINUTES {
        tokio::time::sleep_until((from + minute).into()).await;
        end_phase(
            format!("horizon held, minute {held} of {MINUTES}"),
            &mut from,
        )
        .await?;
    }
    sqlx::raw_sql("COMMIT")
        .execute(&mut *holder)
        .await
        .map_err(failed("ending the hold"))?;
    tokio::time::sleep_until((from + after).into()).await;
    end_phase(
        format!("the {} s after it is released", after.as_secs()),
        &mut from,
    )
    .await?;

    let _ = stop_live.send(true);
    let written = live.await.map_err(failed("the live traffic"))??;
    delivered(&started, written as usize, Duration::from_secs(120)).await?;
    stopped(stop_relay, running).await?;
    Ok(rows(title, &phases, &committed, &started))
}

/// The table's rows: each phase's figures, then the targets' ratios.
fn rows(title: &str, phases: &[Phase], committed: &Instants, started: &Instants) -> Vec<Row> {
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let mut rows = Vec::new();
    let mut p99s = Vec::new();
    for phase in phases {
        let scenario = format!("{title}, {}", phase.name);
        let (latencies, share) = figures(committed, started, phase.from..phase.to);
        if latencies.is_empty() {
            continue;
        }
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row::measured(
                &format!("{scenario}: live latency {what}"),
                "ms",
                ms(percentile(&latencies, p)),
                Target::None,
            ));
        }
        p99s.push(ms(percentile(&latencies, 0.99)));
        rows.push(Row::measured(
            &format!("{scenario}: delivered, share of offered"),
            "%",
            share,
            Target::None,
        ));
        for (name, unit, value) in &phase.gauges {
            rows.push(Row::measured(
                &format!("{scenario}: {name} at its end"),
                unit,
                *value,
                Target::None,
            ));
        }
    }
    if let (Some(before), Some(last)) = (p99s.first(), p99s.iter().rev().nth(1)) {
        rows.push(Row::measured(
            &format!("{title}: live p99 in the hold's last minute ÷ before"),
            "×",
            ratio(*last, *before),
            Target::Below(2.0),
        ));
    }
    if let (Some(before), Some(released)) = (phases.first(), phases.last()) {
        let size = |phase: &Phase| -> f64 {
            phase
                .gauges
                .iter()
                .filter(|(_, unit, _)| *unit == "MiB")
                .map(|(_, _, value)| value)
                .sum()
        };
        rows.push(Row::measured(
            &format!("{title}: files' size once released ÷ before"),
            "×",
            ratio(size(released), size(before)),
            Target::Below(2.0),
        ));
    }
    rows
}

/// MariaDB's gauges: the history list's length, and the outbox tables' tablespaces.
async fn innodb(pool: &MySqlPool) -> Result<Vec<Gauge>, String> {
    use sqlx::Row as _;
    let status = sqlx::query("SHOW ENGINE INNODB STATUS")
        .fetch_one(pool)
        .await
        .map_err(failed("reading InnoDB's status"))?;
    let text: String = status
        .try_get("Status")
        .map_err(failed("reading InnoDB's status"))?;
    let history = text
        .lines()
        .find_map(|line| line.strip_prefix("History list length "))
        .and_then(|length| length.trim().parse::<f64>().ok())
        .ok_or("InnoDB's status names no history list length")?;
    let allocated: f64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(ALLOCATED_SIZE), 0) AS DOUBLE) / 1048576 \
         FROM information_schema.INNODB_SYS_TABLESPACES \
         WHERE NAME LIKE CONCAT(DATABASE(), '/outbox\\_%')",
    )
    .fetch_one(pool)
    .await
    .map_err(failed("reading the tablespaces' sizes"))?;
    Ok(vec![
        ("history list length", "entries", history),
        ("outbox tablespaces", "MiB", allocated),
    ])
}

/// SQLite's gauges: the sizes of the write-ahead log and of the database file.
fn files(path: &Path) -> Vec<Gauge> {
    let mib = |path: &Path| {
        std::fs::metadata(path).map_or(0.0, |metadata| metadata.len() as f64 / 1048576.0)
    };
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    vec![
        ("write-ahead log", "MiB", mib(Path::new(&wal))),
        ("database file", "MiB", mib(path)),
    ]
}
