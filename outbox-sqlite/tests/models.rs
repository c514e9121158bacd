//! Replicated models as a user declares them, written with SQLite's model writes (`insert`,
//! `update`, `save`, `delete` in the caller's transaction) and delivered by a relay that reads
//! the rows back. Moved here from `outbox-core/tests/models.rs` (core no longer depends on a
//! backend), which keeps the declarations' own tests and runs the same deliveries on the
//! in-memory store.

use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{
    BoxError, Deletion, Destination, ModelBatch, Registry, Relay, Replication, State,
    outbox_handler, outbox_scope, replicated_model,
};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

#[outbox_scope(id = 1)]
struct Organization;

/// A local model: outboxes stay in this database.
#[replicated_model(scope = Organization, id = 20, table = "projects", shard = organization_id)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
    name: String,
    archived: bool,
}

/// What the deletion handler of a member needs once the row is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemberTombstone {
    email: String,
}

impl From<&Member> for MemberTombstone {
    fn from(member: &Member) -> Self {
        Self {
            email: member.email.clone(),
        }
    }
}

/// A fan-out model: each write names the regions it goes to.
#[replicated_model(
    scope = Organization,
    id = 21,
    table = "members",
    shard = org,
    key = member_id,
    tombstone = MemberTombstone,
    fan_out
)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Member {
    member_id: i32,
    org: i32,
    email: String,
}

/// What the handlers saw, in order.
#[derive(Debug, Default, Clone)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn push(&self, line: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[outbox_handler]
async fn replicate_project(
    replication: Replication<Project>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let project = &replication.object;
    seen.push(format!(
        "replicate project {} {:?} archived={} in org {}",
        project.id,
        project.name,
        project.archived,
        replication.shard_identifier()
    ));
    Ok(())
}

#[outbox_handler]
async fn delete_project(
    deletion: Deletion<Project>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    seen.push(format!(
        "delete project {} in org {}",
        deletion.object_identifier,
        deletion.shard_identifier()
    ));
    Ok(())
}

#[outbox_handler]
async fn replicate_member(
    replication: Replication<Member>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let destination = replication.destination().ok_or("no destination")?;
    seen.push(format!(
        "replicate member {} {} to {destination}",
        replication.object.member_id, replication.object.email
    ));
    Ok(())
}

#[outbox_handler]
async fn delete_member(
    deletion: Deletion<Member>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let destination = deletion.destination().ok_or("no destination")?;
    seen.push(format!(
        "delete member {} {} from {destination}",
        deletion.object_identifier, deletion.payload.email
    ));
    Ok(())
}

async fn database() -> (tempfile::TempDir, SqlitePool) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let pool = outbox_sqlite::connect(&dir.path().join("app.db"))
        .await
        .expect("open");
    outbox_sqlite::migrate(&pool).await.expect("migrate");
    for ddl in [
        "CREATE TABLE projects (id INTEGER PRIMARY KEY, organization_id INTEGER NOT NULL, \
         name TEXT NOT NULL, archived BOOLEAN NOT NULL)",
        "CREATE TABLE members (member_id INTEGER PRIMARY KEY, org INTEGER NOT NULL, \
         email TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await.expect("create table");
    }
    (dir, pool)
}

async fn drain(pool: &SqlitePool, seen: &Seen) -> Vec<String> {
    let registry = Registry::builder()
        .discovered()
        .state(seen.clone())
        .build()
        .expect("registry");
    let report = Relay::new(outbox_sqlite::SqliteStore::new(pool.clone()), registry)
        .drain()
        .await
        .expect("drain");
    assert!(report.is_clean(), "{report:?}");
    seen.take()
}

fn project(id: i64, name: &str) -> Project {
    Project {
        id,
        organization_id: 7,
        name: name.into(),
        archived: id % 2 == 0,
    }
}

#[tokio::test]
async fn present_objects_replicate_and_gone_ones_are_deleted() {
    let (_dir, pool) = database().await;
    let seen = Seen::default();

    // Create, then update twice: one replication of the newest state.
    let mut tx = pool.begin().await.unwrap();
    let created = outbox_sqlite::insert(&mut tx, &[project(1, "api"), project(2, "web")])
        .await
        .unwrap();
    assert_eq!(created, 2);
    outbox_sqlite::update(&mut tx, &project(1, "api v2"))
        .await
        .unwrap();
    outbox_sqlite::save(&mut tx, &project(1, "api v3"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        drain(&pool, &seen).await,
        [
            "replicate project 1 \"api v3\" archived=false in org 7",
            "replicate project 2 \"web\" archived=true in org 7",
        ]
    );

    // Delete: the deletion handler runs with the identifiers.
    let mut tx = pool.begin().await.unwrap();
    let deleted = outbox_sqlite::delete(&mut tx, &project(2, "web"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(drain(&pool, &seen).await, ["delete project 2 in org 7"]);

    // Saved, then deleted before delivery: only the deletion is delivered.
    let mut tx = pool.begin().await.unwrap();
    outbox_sqlite::save(&mut tx, &project(3, "tmp"))
        .await
        .unwrap();
    outbox_sqlite::delete(&mut tx, &project(3, "tmp"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(drain(&pool, &seen).await, ["delete project 3 in org 7"]);
}

#[tokio::test]
async fn rolled_back_model_writes_leave_nothing() {
    let (_dir, pool) = database().await;
    let mut tx = pool.begin().await.unwrap();
    outbox_sqlite::insert(&mut tx, &project(1, "api"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM projects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    assert_eq!(drain(&pool, &Seen::default()).await, Vec::<String>::new());
}

#[tokio::test]
async fn fan_out_models_reach_each_destination() {
    let (_dir, pool) = database().await;
    let seen = Seen::default();
    let regions = || ["eu", "us"].map(|name| Destination::new(name).unwrap());
    let member = Member {
        member_id: 5,
        org: 9,
        email: "ada@example.com".into(),
    };

    let mut tx = pool.begin().await.unwrap();
    outbox_sqlite::save(&mut tx, ModelBatch::to(&member, regions()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut lines = drain(&pool, &seen).await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "replicate member 5 ada@example.com to eu",
            "replicate member 5 ada@example.com to us",
        ]
    );

    let mut tx = pool.begin().await.unwrap();
    outbox_sqlite::delete(&mut tx, ModelBatch::to(&member, regions()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut lines = drain(&pool, &seen).await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "delete member 5 ada@example.com from eu",
            "delete member 5 ada@example.com from us",
        ]
    );
}
