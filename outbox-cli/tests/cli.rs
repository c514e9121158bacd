//! The `outbox` command, run as a user runs it (the built binary), against real PostgreSQL
//! and SQLite databases holding failing, parked, paused and dead-lettered shards.

use std::process::Output;
use std::time::{Duration, SystemTime};

use assert_cmd::Command;
use clap::Parser;
use outbox_core::admin::{Admin, Catalog, PauseTarget};
use outbox_core::store::Store;
use outbox_core::{BoxError, Delivery, Message, Registry, Relay, ShardKey};
use outbox_sqlx::{Dialect, SqlxStore};
use outbox_testkit::conformance::a_running_and_a_silent_relay;
use outbox_testkit::fixtures::{FutureCategory, OrgUpdate, ProjectUpdate, note};
use outbox_testkit::mysql::{MySqlDatabase, MySqlTestDatabase};
use outbox_testkit::postgres::{PgDatabase, PgTestDatabase};
use outbox_testkit::sqlite::SqliteTestDatabase;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};
use serde_json::Value;

/// Where a test database is, as the command takes it.
trait Url {
    fn url(&self) -> String;
}

impl Url for PgTestDatabase {
    fn url(&self) -> String {
        SqlxTestDatabase::<PgDatabase>::url(self)
    }
}

impl Url for MySqlTestDatabase {
    fn url(&self) -> String {
        SqlxTestDatabase::<MySqlDatabase>::url(self)
    }
}

impl Url for SqliteTestDatabase {
    fn url(&self) -> String {
        format!("sqlite://{}", self.path().display())
    }
}

/// Runs `outbox ARGS` against `url`.
fn outbox(url: &str, args: &[&str]) -> Output {
    Command::cargo_bin("outbox")
        .expect("the outbox binary")
        .env("DATABASE_URL", url)
        .args(args)
        .output()
        .expect("run outbox")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `outbox ARGS`, expecting exit code `code`; its stdout.
#[track_caller]
fn expect(url: &str, args: &[&str], code: i32) -> String {
    let output = outbox(url, args);
    assert_eq!(
        output.status.code(),
        Some(code),
        "outbox {args:?}\nstdout: {}\nstderr: {}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Runs `outbox --json ARGS`, expecting success; its JSON.
#[track_caller]
fn json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&expect(url, &all, 0)).expect("JSON output")
}

/// Every dead letter.
async fn dead_letters<S: Admin>(store: &S) -> Vec<outbox_core::admin::DeadLetter> {
    store
        .dead_letters(&Default::default())
        .await
        .expect("list dead letters")
}

/// The organization scope's shard `n`.
fn org(n: i64) -> ShardKey {
    outbox_testkit::fixtures::org_shard(n)
}

/// A database with one shard of each kind: 1 backing off (its OrgUpdate handler fails, two
/// messages), 2 paused (three messages), 3 parked on an unknown category, 4 due, and one dead
/// letter (a ProjectUpdate of shard 5, set aside at its first failure).
async fn operated<P: Provision>(database: &SqlxTestDatabase<P>) -> Registry {
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    store
        .pause(&PauseTarget::Shard(org(2)), Some("receiver maintenance"))
        .await
        .expect("pause");
    let messages: Vec<Message> = vec![
        note::<OrgUpdate>(1, 1, 1),
        note::<OrgUpdate>(1, 2, 2),
        note::<OrgUpdate>(2, 1, 3),
        note::<OrgUpdate>(2, 2, 4),
        note::<OrgUpdate>(2, 3, 5),
        note::<FutureCategory>(3, 1, 6),
        note::<ProjectUpdate>(5, 1, 7),
    ];
    write(database, &messages).await;
    Relay::new(store, registry()).drain().await.expect("drain");
    write(database, &[note::<OrgUpdate>(4, 1, 8)]).await;
    registry()
}

/// Writes `messages` in a transaction of their own.
async fn write<P: Provision>(database: &SqlxTestDatabase<P>, messages: &[Message]) {
    database.write_messages(messages).await;
}

/// The test categories, with OrgUpdate failing in shard 1 and ProjectUpdate failing
/// everywhere, set aside at its first failure.
fn registry() -> Registry {
    let org_update = |delivery: Delivery<OrgUpdate>| {
        let fail = delivery.shard.shard_identifier == 1;
        async move {
            if fail {
                return Err::<(), BoxError>("the receiver said 503".into());
            }
            Ok(())
        }
    };
    let project_update =
        |_: Delivery<ProjectUpdate>| async { Err::<(), BoxError>("no such project".into()) };
    Registry::builder()
        .handle::<OrgUpdate>(org_update)
        .handle::<ProjectUpdate>(project_update)
        .max_attempts::<ProjectUpdate>(1)
        .build()
        .expect("a registry")
}

/// `status`, `shards` and `messages` on a database with shards of every kind.
async fn reads<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    operated(&database).await;
    let url = database.url();

    let status = expect(&url, &["status"], 0);
    for line in [
        "pending messages  7",
        "shards            4: 1 due, 0 in flight, 1 backing off, 1 parked, 1 paused",
        "dead letters      1",
    ] {
        assert!(status.contains(line), "{line:?} in:\n{status}");
    }
    let rows: Vec<Vec<&str>> = status
        .lines()
        .skip_while(|line| !line.starts_with("SHARD"))
        .skip(1)
        .map(|line| line.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["1:2", "paused", "3"],
            ["1:1", "backing", "off"],
            ["1:3", "parked", "1"],
            ["1:4", "due", "1"],
        ],
        "{status}"
    );
    let status = json(&url, &["status", "--deepest", "2"]);
    assert_eq!(status["pending_messages"], 7);
    assert_eq!(status["shards_in_backoff"], 1);
    assert_eq!(status["dead_letters"], 1);
    let deepest: Vec<&str> = status["deepest"]
        .as_array()
        .expect("deepest")
        .iter()
        .map(|shard| shard["shard"].as_str().expect("a shard"))
        .collect();
    assert_eq!(deepest, ["1:2", "1:1"]);

    let failing = json(&url, &["shards", "--failing"]);
    let failing = failing.as_array().expect("shards");
    assert_eq!(failing.len(), 2);
    assert_eq!(failing[0]["shard"], "1:1");
    assert_eq!(failing[0]["state"], "backing off");
    assert_eq!(failing[0]["attempts"], 1);
    assert!(
        failing[0]["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("the receiver said 503"))
    );
    assert_eq!(failing[1]["state"], "parked");
    assert_eq!(failing[1]["parked_category"], "99");
    let paused = json(&url, &["shards", "--paused"]);
    assert_eq!(paused[0]["shard"], "1:2");
    let parked = json(&url, &["shards", "--parked"]);
    assert_eq!(parked.as_array().map(Vec::len), Some(1));
    let listed = |arguments: &[&str]| {
        json(&url, arguments)
            .as_array()
            .expect("shards")
            .iter()
            .map(|shard| shard["shard"].as_str().expect("a shard").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(&["shards", "--scope", "1"]),
        ["1:2", "1:1", "1:3", "1:4"]
    );
    assert!(listed(&["shards", "--scope", "2"]).is_empty());
    assert_eq!(
        listed(&["shards", "--failing", "--category", "99"]),
        ["1:3"],
        "the parked shard holds the category no binary knows"
    );

    let messages = expect(&url, &["messages", "--shard", "1:1"], 0);
    assert!(
        messages.contains("1 attempt(s)") && messages.contains("the receiver said 503"),
        "{messages}"
    );
    let messages = json(&url, &["messages", "--shard", "1:2", "--limit", "2"]);
    let listed = messages["messages"].as_array().expect("messages");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["payload"]["seq"], 3);
    assert_eq!(listed[1]["payload"]["seq"], 4);

    // A new message in the backing-off shard makes it due at once (S19): the summary, the
    // table, the listing of failing shards and the shard's messages all say so.
    write(&database, &[note::<OrgUpdate>(1, 3, 9)]).await;
    let status = expect(&url, &["status"], 0);
    assert!(
        status.contains("shards            4: 2 due, 0 in flight, 0 backing off"),
        "{status}"
    );
    let row = status
        .lines()
        .find(|line| line.starts_with("1:1 "))
        .expect("shard 1:1's row");
    let row: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((row[1], row[6]), ("due", "now"), "{status}");
    let failing = json(&url, &["shards", "--failing"]);
    assert_eq!(failing[0]["shard"], "1:1");
    assert_eq!(failing[0]["state"], "due");
    assert_eq!(failing[0]["next_retry_at"], Value::Null);
    let messages = expect(&url, &["messages", "1:1"], 0);
    assert!(
        messages.contains("shard 1:1: due, 1 attempt(s), next retry now"),
        "{messages}"
    );
}

/// `retry`, `pause`/`resume` and `dead-letters` change what they say, refuse what they
/// cannot do with exit code 3, and change nothing then.
async fn operations<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    operated(&database).await;
    let url = database.url();
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let state = |shard: ShardKey| {
        let store = store.clone();
        async move {
            store
                .shard_states()
                .await
                .expect("states")
                .into_iter()
                .find(|state| state.shard == shard)
                .expect("a state")
        }
    };

    // Retry: due now, attempts kept; a second retry has nothing to do.
    assert!(state(org(1)).await.retry_at > Some(SystemTime::now()));
    expect(&url, &["retry", "1:1"], 0);
    let retried = state(org(1)).await;
    assert!(retried.retry_at <= Some(SystemTime::now()));
    assert_eq!(retried.attempts, 1);
    let refused = outbox(&url, &["retry", "1:1"]);
    assert_eq!(refused.status.code(), Some(3));
    assert!(
        stderr(&refused).contains("not backing off"),
        "{}",
        stderr(&refused)
    );

    // Pause and resume a scope; resuming what is not paused is refused. The database is named
    // after the command as well as before it; a scope this binary does not know gets a word.
    let paused = outbox(
        "",
        &[
            "pause",
            "--scope",
            "1",
            "--reason",
            "incident 42",
            "--database-url",
            &url,
        ],
    );
    assert_eq!(paused.status.code(), Some(0), "{}", stderr(&paused));
    assert!(
        stdout(&paused).contains("note: this binary does not know scope 1"),
        "{}",
        stdout(&paused)
    );
    let pauses = json(&url, &["pauses"]);
    let targets: Vec<&str> = pauses
        .as_array()
        .expect("pauses")
        .iter()
        .map(|pause| pause["target"].as_str().expect("a target"))
        .collect();
    assert_eq!(targets, ["shard 1:2", "scope 1"]);
    assert_eq!(json(&url, &["status"])["shards_paused"], 4);
    expect(&url, &["resume", "--scope", "1"], 0);
    assert_eq!(expect(&url, &["resume", "--scope", "1"], 3), "");
    expect(&url, &["pause", "--category", "2"], 0);
    assert_eq!(store.pauses().await.expect("pauses").len(), 2);
    expect(&url, &["resume", "--category", "2"], 0);
    expect(&url, &["resume", "1:2"], 0);
    assert!(store.pauses().await.expect("pauses").is_empty());

    // Dead letters: listed; a replay of a category this binary does not know is refused.
    let letters = json(&url, &["dead-letters", "list"]);
    let letters = letters.as_array().expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["category"], "2");
    assert!(
        letters[0]["error"]
            .as_str()
            .is_some_and(|error| error.contains("no such project"))
    );
    let id = letters[0]["message_id"]
        .as_i64()
        .expect("an id")
        .to_string();
    let refused = outbox(&url, &["dead-letters", "replay", "--all"]);
    assert_eq!(refused.status.code(), Some(3));
    assert!(
        stderr(&refused).contains("does not know category 2"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        expect(&url, &["dead-letters", "replay"], 3),
        "",
        "a replay must say which"
    );
    // A dry run is never refused: it says what a replay would be refused for.
    let dry = expect(&url, &["dead-letters", "replay", "--all", "--dry-run"], 0);
    assert!(
        dry.contains("note: this binary does not know category 2") && dry.contains(&id),
        "{dry}"
    );
    assert_eq!(dead_letters(&store).await.len(), 1);
    let dry = json(
        &url,
        &[
            "dead-letters",
            "replay",
            "--id",
            &id,
            "--allow-unknown-categories",
            "--dry-run",
        ],
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["dead_letters"].as_array().map(Vec::len), Some(1));
    assert_eq!(dead_letters(&store).await.len(), 1);

    let pending_before = store.pending_messages(100).await.expect("pending").len();
    let replayed = json(
        &url,
        &[
            "dead-letters",
            "replay",
            "--id",
            &id,
            "--allow-unknown-categories",
        ],
    );
    assert_eq!(replayed["replayed_as"].as_array().map(Vec::len), Some(1));
    assert!(dead_letters(&store).await.is_empty());
    assert_eq!(
        store.pending_messages(100).await.expect("pending").len(),
        pending_before + 1
    );
    let again = outbox(
        &url,
        &[
            "dead-letters",
            "replay",
            "--id",
            &id,
            "--allow-unknown-categories",
        ],
    );
    assert_eq!(again.status.code(), Some(3));
    assert!(
        stderr(&again).contains(&format!("no dead letter with message id {id}")),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        store.pending_messages(100).await.expect("pending").len(),
        pending_before + 1,
        "nothing changed"
    );

    // Purge: the replayed message fails again and is set aside again; purged for good.
    Relay::new(store.clone(), registry())
        .drain()
        .await
        .expect("drain");
    let dry = json(
        &url,
        &["dead-letters", "purge", "--category", "2", "--dry-run"],
    );
    assert_eq!(dry["dead_letters"].as_array().map(Vec::len), Some(1));
    assert_eq!(dead_letters(&store).await.len(), 1);
    let purged = json(&url, &["dead-letters", "purge", "--category", "2"]);
    assert_eq!(purged["purged"], 1);
    assert!(dead_letters(&store).await.is_empty());
    // Set aside the head of failing shard 1: refused while a relay holds the shard, then the
    // shard goes on without it; a second time, it is not pending.
    let head = store.shard_messages(&org(1), 1).await.expect("messages")[0]
        .id
        .0
        .to_string();
    expect(&url, &["retry", "1:1"], 0);
    let session = Store::claim(
        &store,
        &org(1),
        &outbox_core::store::ClaimOptions {
            worker: "relay-7".to_owned(),
            lease: Duration::from_secs(30),
            mode: outbox_core::HandlerMode::Leased,
        },
    )
    .await
    .expect("claim")
    .expect("shard 1 is due after its retry");
    let held = outbox(&url, &["dead-letters", "set-aside", "--id", &head]);
    assert_eq!(held.status.code(), Some(3), "{}", stderr(&held));
    assert!(
        stderr(&held).contains("shard 1:1 is held by relay-7"),
        "{}",
        stderr(&held)
    );
    Store::release(&store, outbox_core::store::ShardSession::lease(&session))
        .await
        .expect("release");
    drop(session);
    let set_aside = expect(
        &url,
        &[
            "dead-letters",
            "set-aside",
            "--id",
            &head,
            "--reason",
            "ticket 7",
        ],
        0,
    );
    assert!(
        set_aside.contains(&format!("set aside message {head} of shard 1:1")),
        "{set_aside}"
    );
    let letters = dead_letters(&store).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].error, "set aside by an operator: ticket 7");
    let again = outbox(&url, &["dead-letters", "set-aside", "--id", &head]);
    assert_eq!(again.status.code(), Some(3));
    assert!(
        stderr(&again).contains(&format!("no pending message with id {head}")),
        "{}",
        stderr(&again)
    );
}

/// Names: a binary that knows the categories shows and reads them.
async fn names<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    let registry = operated(&database).await;
    let catalog = Catalog::of(&registry);
    let url = database.url();
    let run = |args: &[&str]| {
        let catalog = catalog.clone();
        let mut argv = vec!["outbox", "--database-url", url.as_str()];
        argv.extend_from_slice(args);
        let cli = outbox_cli::Cli::parse_from(argv);
        async move {
            let mut out = Vec::new();
            let result = outbox_cli::run(cli, &catalog, &mut out).await;
            (result, String::from_utf8(out).expect("UTF-8"))
        }
    };
    let (result, shown) = run(&["shards"]).await;
    result.expect("shards");
    assert!(shown.contains("organization:1"), "{shown}");
    for args in [
        &["messages", "--shard", "organization:1"][..],
        &["messages", "organization:1"],
    ] {
        let (result, shown) = run(args).await;
        result.expect("messages");
        assert!(shown.contains("org_update"), "{shown}");
    }
    let (result, shown) = run(&["pause", "--scope", "organization"]).await;
    result.expect("pause a known scope");
    assert!(
        !shown.contains("note:"),
        "a known scope needs no word: {shown}"
    );
    let (result, shown) = run(&["pause", "--scope", "99"]).await;
    result.expect("pause scope 99");
    assert!(
        shown.contains("this binary does not know scope 99"),
        "{shown}"
    );
    let (result, shown) = run(&[
        "--json",
        "dead-letters",
        "replay",
        "--category",
        "project_update",
        "--dry-run",
    ])
    .await;
    result.expect("a known category's replay is not refused");
    assert!(
        shown.contains("\"category\": \"project_update\""),
        "{shown}"
    );
    let (result, _) = run(&["pause", "--category", "webhook"]).await;
    let error = result.expect_err("an unknown name");
    assert_eq!(error.exit_code(), 3);
    assert!(error.to_string().contains("org_update"), "{error}");
}

/// Migrations: applied, then up to date; printed, applied by another tool, then found.
async fn migrations<P: Provision>(database: SqlxTestDatabase<P>, printed: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    let versions: Vec<i64> = P::Dialect::MIGRATIONS.iter().map(|m| m.version).collect();
    let url = database.url();
    let refused = outbox(&url, &["status"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("apply the migrations with `outbox migrate`"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(stderr(&refused).lines().count(), 1, "one line");
    let first = json(&url, &["migrate"]);
    assert_eq!(first["before"], serde_json::json!([]));
    assert_eq!(first["after"], serde_json::json!(versions));
    assert!(expect(&url, &["migrate"], 0).contains("up to date"));
    expect(&url, &["status"], 0);

    let sql = expect(&printed.url(), &["migrate", "--print"], 0);
    printed.execute(&sql).await;
    assert!(expect(&printed.url(), &["migrate"], 0).contains("up to date"));
    assert!(expect(&printed.url(), &["status"], 0).contains("pending messages  0"));
}

/// Backfills: started by number from the installed binary once a relay recorded the model's
/// version (refused before), followed in `backfill status` and `status`, paused; started by
/// name, to the version the code declares, from a binary that knows the model.
async fn backfills<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    use outbox_core::backfill::{BackfillModel, BackfillOptions, BackfillOutcome};
    use outbox_core::store::Store;
    use outbox_testkit::fixtures::{MODEL_TABLES, ModelRecorder, Project};

    for ddl in MODEL_TABLES {
        database.execute(ddl).await;
    }
    for id in 1..=3 {
        database
            .execute(&format!(
                "INSERT INTO projects (id, organization_id, name, archived, score) \
                 VALUES ({id}, 1, 'p{id}', FALSE, 0)"
            ))
            .await;
    }
    let url = database.url();
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let tick = || async {
        let options = BackfillOptions {
            worker: "cli-test".to_owned(),
            budget: 100,
        };
        store
            .backfill(&BackfillModel::of::<Project>(), &options)
            .await
            .expect("a backfill tick")
    };
    assert!(expect(&url, &["backfill", "status"], 0).contains("no backfills"));
    let refused = outbox(&url, &["backfill", "start", "20"]);
    assert_eq!(refused.status.code(), Some(3));
    assert!(
        stderr(&refused).contains("give --version"),
        "{}",
        stderr(&refused)
    );

    assert_eq!(tick().await.outcome, BackfillOutcome::Gated);
    let started = expect(&url, &["backfill", "start", "20"], 0);
    assert!(
        started.contains("started the backfill of model project to version 2"),
        "the version and name the relays recorded: {started}"
    );
    let listed = json(&url, &["backfill", "status"]);
    assert_eq!(listed[0]["model"], "project", "{listed}");
    assert_eq!(listed[0]["phase"], "walking", "{listed}");
    assert_eq!(listed[0]["target_version"], 2, "{listed}");

    assert!(matches!(
        tick().await.outcome,
        BackfillOutcome::Walked {
            rows: 3,
            complete: true,
            ..
        }
    ));
    let status = expect(&url, &["status"], 0);
    assert!(
        status.contains("backfills") && status.contains("done"),
        "{status}"
    );
    let shown = json(&url, &["status"]);
    assert_eq!(shown["backfills"][0]["rows_walked"], 3, "{shown}");
    assert_eq!(shown["backfills"][0]["done_version"], 2, "{shown}");
    // One batch: no rate measured yet, and the field says so.
    assert_eq!(
        shown["backfills"][0].get("rows_per_second"),
        Some(&Value::Null),
        "{shown}"
    );
    let nothing = outbox(&url, &["backfill", "pause", "20"]);
    assert_eq!(nothing.status.code(), Some(3), "{}", stderr(&nothing));

    let ahead = expect(&url, &["backfill", "start", "20", "--version", "3"], 0);
    assert!(
        ahead.contains("no relay's code declares that version yet"),
        "{ahead}"
    );
    assert!(expect(&url, &["backfill", "pause", "20"], 0).contains("paused the backfill"));
    assert_eq!(json(&url, &["backfill", "status"])[0]["target_version"], 2);

    // A binary that knows the model: by name, to its code's version.
    let catalog = Catalog::of(
        &ModelRecorder::default()
            .register(Registry::builder())
            .build()
            .expect("a registry"),
    );
    let cli = outbox_cli::Cli::parse_from([
        "outbox",
        "--database-url",
        url.as_str(),
        "backfill",
        "start",
        "project",
    ]);
    let mut out = Vec::new();
    outbox_cli::run(cli, &catalog, &mut out)
        .await
        .expect("start by name");
    let shown = String::from_utf8(out).expect("UTF-8");
    assert!(
        shown.contains("the backfill of model project to version 2 is done already"),
        "{shown}"
    );
}

/// One test per backend for each scenario: `name(database…)`, each database fresh and
/// `migrated` or `create`d empty.
/// `status` says which relays run, which stopped answering, and the breakers they found
/// open: none running is said as such.
async fn relays<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    let url = database.url();
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let status = expect(&url, &["status"], 0);
    assert!(
        status.contains("relays            none running: nothing is delivered"),
        "{status}"
    );
    assert!(!status.contains("open breakers"), "{status}");

    let started = SystemTime::now() - Duration::from_secs(3 * 3600);
    a_running_and_a_silent_relay(&store, started).await;
    let status = expect(&url, &["status"], 0);
    for line in [
        "relays            1 running, 1 stopped answering",
        "open breakers     nats: 3 shards waiting",
    ] {
        assert!(status.contains(line), "{line:?} in:\n{status}");
    }
    let rows: Vec<Vec<&str>> = status
        .lines()
        .skip_while(|line| !line.starts_with("WORKER"))
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert_eq!(rows[0][..4], ["relay-a", "running", "3h", "0m"], "{status}");
    assert_eq!(rows[0][rows[0].len() - 3..], ["2", "3", "nats"], "{status}");
    assert_eq!(
        rows[1][..3],
        ["relay-b", "stopped", "answering"],
        "{status}"
    );

    let status = json(&url, &["status"]);
    let relays = status["relays"].as_array().expect("relays");
    assert_eq!(relays.len(), 2);
    assert_eq!(relays[0]["worker"], "relay-a");
    assert_eq!(relays[0]["running"], true);
    assert_eq!(relays[0]["shards_waiting"], 3);
    assert_eq!(relays[0]["open_breakers"], serde_json::json!(["nats"]));
    assert_eq!(relays[1]["running"], false);
}

/// A consumer's inbox, seen and kept by the command: its dead letters listed (table and
/// JSON, by consumer), its old records purged by consumer or for every consumer.
async fn inboxes<P: Provision>(database: SqlxTestDatabase<P>)
where
    SqlxTestDatabase<P>: Url,
{
    use outbox_core::inbox::{Consumer, Inbox, InboxDatabase, Incoming, Settled};
    use outbox_core::sink::headers;

    let url = database.url();
    assert_eq!(
        expect(&url, &["inbox", "dead-letters"], 0).trim(),
        "no dead letters in the inbox"
    );
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let billing = Consumer::builder(Inbox::new("billing"), store.clone())
        .handle::<OrgUpdate, _>(|_: Delivery<OrgUpdate>| async { Ok::<_, BoxError>(()) })
        .build()
        .expect("a consumer");
    let poison = Incoming::new(&b"not json"[..], 1)
        .with_header(headers::MESSAGE_ID, "77")
        .with_header(headers::CATEGORY, "org_update");
    let settled = billing
        .process(&poison, || async {}, std::future::pending())
        .await;
    assert_eq!(settled, Some(Settled::DeadLettered));
    for (consumer, id) in [("billing", 1), ("billing", 2), ("search", 1)] {
        let mut tx = store.begin().await.expect("begin");
        let _ = Inbox::new(consumer)
            .receive(tx.as_mut(), outbox_core::MessageId(id))
            .await
            .expect("receive");
        tx.commit().await.expect("commit");
    }

    let listed = expect(&url, &["inbox", "dead-letters", "--consumer", "billing"], 0);
    let row = listed.lines().nth(1).expect("a row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[1..5],
        ["billing", "77", "org_update", "0"],
        "{listed}"
    );
    assert!(listed.contains("no `Outbox-Shard` header"), "{listed}");
    let listed = json(&url, &["inbox", "dead-letters"]);
    assert_eq!(listed[0]["message_id"], 77);
    assert_eq!(listed[0]["payload"], "not json");
    assert_eq!(listed[0]["headers"][headers::CATEGORY], "org_update");
    assert!(
        json(&url, &["inbox", "dead-letters", "--consumer", "search"])
            .as_array()
            .expect("a list")
            .is_empty()
    );

    let kept = expect(
        &url,
        &[
            "inbox",
            "purge",
            "--older-than",
            "1h",
            "--consumer",
            "billing",
        ],
        0,
    );
    assert_eq!(
        kept.trim(),
        "purged 0 of consumer `billing`'s inbox records older than 1h"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = expect(
        &url,
        &[
            "inbox",
            "purge",
            "--older-than",
            "10ms",
            "--consumer",
            "billing",
        ],
        0,
    );
    assert_eq!(
        purged.trim(),
        "purged 3 of consumer `billing`'s inbox records older than 10ms",
        "two received and the dead letter's"
    );
    let purged = json(&url, &["inbox", "purge", "--older-than", "10ms"]);
    assert_eq!(
        purged["done"],
        "purged 1 of every consumer's inbox records older than 10ms"
    );
    let refused = outbox(&url, &["inbox", "purge"]);
    assert_eq!(refused.status.code(), Some(2), "--older-than is required");
}

macro_rules! on_each_backend {
    ($($scenario:ident($($made:ident),+);)+) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario($(super::PgTestDatabase::$made().await),+).await;
                }
            )+
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario($(super::MySqlTestDatabase::$made().await),+).await;
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario($(super::SqliteTestDatabase::$made().await),+).await;
                }
            )+
        }
    };
}

on_each_backend! {
    reads(migrated);
    operations(migrated);
    names(migrated);
    backfills(migrated);
    relays(migrated);
    inboxes(migrated);
    migrations(create, create);
}

#[test]
fn bad_input_is_one_line_and_a_testable_exit_code() {
    let down = outbox("postgres://postgres@127.0.0.1:1/none", &["status"]);
    assert_eq!(down.status.code(), Some(1));
    assert!(
        stderr(&down).contains("database unavailable"),
        "{}",
        stderr(&down)
    );
    assert_eq!(stderr(&down).lines().count(), 1, "{}", stderr(&down));

    let dir = tempfile::tempdir().expect("a directory");
    let missing = format!("sqlite://{}", dir.path().join("none.db").display());
    let refused = outbox(&missing, &["status"]);
    assert_eq!(
        refused.status.code(),
        Some(1),
        "a database that is not there failed"
    );
    assert!(
        stderr(&refused).contains("no database file"),
        "{}",
        stderr(&refused)
    );
    assert!(!dir.path().join("none.db").exists(), "nothing created");

    let usage = Command::cargo_bin("outbox")
        .expect("the outbox binary")
        .env_remove("DATABASE_URL")
        .arg("status")
        .output()
        .expect("run outbox");
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));

    let oracle = outbox("oracle://app:secret@db/app", &["migrate"]);
    assert_eq!(oracle.status.code(), Some(1));
    assert!(
        stderr(&oracle).contains(
            "expected a URL starting with `mariadb:`, `mysql:`, `postgres:`, `postgresql:`, \
             `sqlite:`"
        ),
        "{}",
        stderr(&oracle)
    );
    assert!(
        !stderr(&oracle).contains("secret"),
        "the URL's password is not shown"
    );
}

/// A role that may not change the schema: `migrate` names the step that failed, the cause
/// and what to do.
#[tokio::test(flavor = "multi_thread")]
async fn a_migration_refused_for_want_of_a_right_says_which_and_what_to_do() {
    let database = PgTestDatabase::create().await;
    let role = format!("outbox_no_create_{}", std::process::id());
    database
        .execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC"
        ))
        .await;
    let server: sqlx::postgres::PgConnectOptions = database.url().parse().expect("a URL");
    let url = format!(
        "postgres://{role}@{}:{}/{}",
        server.get_host(),
        server.get_port(),
        database.name()
    );
    let migrate_as_role = || {
        let refused = outbox(&url, &["migrate"]);
        assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
        let said = stderr(&refused);
        assert!(
            said.contains("apply the migrations as one that has it")
                && said.contains("outbox migrate --print"),
            "says what to do: {said}"
        );
        assert!(
            !said.contains("at line"),
            "no PostgreSQL source line: {said}"
        );
        said
    };
    // No right to create the migrations table.
    let said = migrate_as_role();
    assert!(
        said.contains("preparing the `_outbox_migrations` table failed: permission denied"),
        "{said}"
    );
    // The first migration applied by the owner; the role may create, but not alter the
    // owner's tables, as migration 2 does.
    outbox_sqlx::migrate::migrator_up_to::<outbox_postgres::PgDialect>(1)
        .run(database.pool())
        .await
        .expect("migration 1");
    database
        .execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {role}; GRANT ALL ON _outbox_migrations TO {role}"
        ))
        .await;
    let said = migrate_as_role();
    database
        .execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
    assert!(
        said.contains("migration 2 (identifiers wider than BIGINT) failed: must be owner of table"),
        "{said}"
    );
}
