//! Model writes take any executor, as `write` does: the caller's transaction (joined), a
//! connection or a pool (a transaction of the write's own: rows and outboxes together, or
//! neither).

use outbox_core::ModelBatch;
use outbox_sqlx::model::{ModelTarget, apply_to, check_pooled};
use outbox_sqlx::sql::{Executes, get};
use outbox_sqlx::{Dialect, Writable, Write};
use outbox_testkit::fixtures::{MODEL_TABLES, Project};
use outbox_testkit::postgres::{PgDatabase, PgTestDatabase};
use outbox_testkit::sqlite::{SqliteFile, SqliteTestDatabase};
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

type Db<P> = <<P as Provision>::Dialect as Dialect>::Database;

/// (projects, outbox rows) as another connection sees them.
async fn committed<P: Provision>(database: &SqlxTestDatabase<P>) -> (i64, i64) {
    let mut conn = database.pool().acquire().await.expect("a connection");
    let mut counts = Vec::new();
    for sql in [
        "SELECT count(*) FROM projects",
        "SELECT count(*) FROM outbox_messages",
    ] {
        let row = sqlx::query(sql)
            .fetch_one(Db::<P>::on(&mut conn))
            .await
            .expect("count");
        counts.push(get::<Db<P>, i64>(&row, 0).expect("a count"));
    }
    let (projects, outboxes) = (counts[0], counts[1]);
    (projects, outboxes)
}

async fn write<'c, 't: 'c, P: Provision>(
    target: impl ModelTarget<'c, 't, P::Dialect>,
    write: Write,
    projects: &[Project],
) -> Result<u64, outbox_core::Error>
where
    Project: Writable<P::Dialect>,
{
    apply_to::<P::Dialect, Project>(target, write, &ModelBatch::local(projects))
        .await
        .map(|written| written.rows)
}

async fn model_writes_take_any_executor<P: Provision>()
where
    Project: Writable<P::Dialect>,
    for<'c> &'c mut <Db<P> as sqlx::Database>::Connection: ModelTarget<'c, 'static, P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database.execute(MODEL_TABLES[0]).await;
    check_pooled::<P::Dialect, Project>(database.pool())
        .await
        .expect("the model matches");
    let pool = database.pool();

    // A pool: committed on return.
    let first = [Project::new(1, 7, "a"), Project::new(2, 7, "b")];
    assert_eq!(
        write::<P>(pool, Write::Insert, &first)
            .await
            .expect("insert"),
        2
    );
    assert_eq!(committed(&database).await, (2, 2));

    // A connection outside any transaction: committed on return.
    let mut conn = pool.acquire().await.expect("a connection");
    let renamed = Project::new(1, 7, "renamed");
    let updated = write::<P>(&mut *conn, Write::Update, std::slice::from_ref(&renamed)).await;
    assert_eq!(updated.expect("update"), 1);
    drop(conn);
    assert_eq!(committed(&database).await, (2, 3));

    // The caller's transaction, rolled back: nothing.
    let mut tx = pool.begin().await.expect("begin");
    write::<P>(&mut tx, Write::Save, &[Project::new(3, 7, "c")])
        .await
        .expect("save");
    tx.rollback().await.expect("roll back");
    assert_eq!(committed(&database).await, (2, 3));

    // The connection of a caller's transaction: the write's own is a savepoint, rolled back
    // with the caller's.
    let mut tx = pool.begin().await.expect("begin");
    write::<P>(&mut *tx, Write::Delete, &[Project::new(2, 7, "b")])
        .await
        .expect("delete");
    tx.rollback().await.expect("roll back");
    assert_eq!(committed(&database).await, (2, 3));

    // A batch of more rows than one statement takes, whose last key exists: the first
    // statement's rows go with the failed second's (the write's own transaction rolls back).
    let per_statement = <P::Dialect as Dialect>::MAX_PARAMETERS / 6;
    let mut batch: Vec<Project> = (10..)
        .take(per_statement)
        .map(|id| Project::new(id, 7, "bulk"))
        .collect();
    batch.push(Project::new(1, 7, "taken"));
    let error = write::<P>(pool, Write::Insert, &batch)
        .await
        .expect_err("key 1 exists");
    assert!(
        matches!(error, outbox_core::Error::Database { .. }),
        "{error:?}"
    );
    assert_eq!(
        committed(&database).await,
        (2, 3),
        "nothing of the failed batch"
    );
}

#[tokio::test]
async fn postgres_model_writes_take_any_executor() {
    model_writes_take_any_executor::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_model_writes_take_any_executor() {
    model_writes_take_any_executor::<SqliteFile>().await;
}

/// The backends' public functions take them too.
#[tokio::test]
async fn the_backends_functions_take_connections_and_pools() {
    let pg = PgTestDatabase::migrated().await;
    pg.execute(MODEL_TABLES[0]).await;
    let project = Project::new(1, 7, "a");
    outbox_postgres::insert(pg.pool(), &project)
        .await
        .expect("a pool");
    let mut conn = pg.pool().acquire().await.expect("a connection");
    outbox_postgres::save(&mut *conn, &project)
        .await
        .expect("a connection");
    assert_eq!(committed(&pg).await, (1, 2));

    let sqlite = SqliteTestDatabase::migrated().await;
    sqlite.execute(MODEL_TABLES[0]).await;
    outbox_sqlite::insert(sqlite.pool(), &project)
        .await
        .expect("a pool");
    let mut conn = sqlite.pool().acquire().await.expect("a connection");
    outbox_sqlite::delete(&mut *conn, &project)
        .await
        .expect("a connection");
    drop(conn);
    assert_eq!(committed(&sqlite).await, (0, 2));
}
