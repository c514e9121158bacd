//! # outbox quickstart
//!
//! An organization/project service on SQLite, with no server to run. The **cell** database
//! holds the service's data; every change writes an outbox message in the same transaction.
//! The relay then replicates the changes into a second, **control** database:
//!
//! - `Project` is a replicated model: `outbox::sqlite::insert`, `update` and `delete` write its
//!   row and its outbox together, and at delivery the relay reads the row again: the
//!   replication handler copies it to control while it exists, the deletion handler removes the
//!   copy once it is gone. Three renames of one project coalesce into one delivery.
//! - `OrganizationRenamed` is a plain category: its payload is the message.
//!
//! ```text
//! cargo run -p quickstart
//! cargo run -p quickstart -- --serve   # then keeps the relay running until SIGTERM or Ctrl-C
//! ```
//!
//! The story delivers with `relay.drain()`, which returns once nothing is due; a service runs
//! the relay in the background with `relay.run(shutdown_signal())`, as `--serve` does at the
//! end, and stops it gracefully on SIGTERM (what Kubernetes and systemd send) or Ctrl-C.

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use outbox::admin::Admin;
use outbox::sqlite::SqliteStore;
use outbox::{
    BoxError, Deletion, Delivery, Message, Registry, Relay, Replication, State, outbox_category,
    outbox_handler, outbox_scope, replicated_model, shutdown_signal,
};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

/// Outboxes are sharded by organization: one organization's changes arrive in order.
#[outbox_scope(id = 1)]
struct Organization;

/// A project, replicated from the cell to control: one category covers its creation, its
/// updates and its deletion.
#[replicated_model(scope = Organization, id = 1, table = "projects", shard = organization_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
    name: String,
}

/// "Organization `object_identifier` is now called `name`": the payload is the message.
#[outbox_category(scope = Organization, id = 2)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrganizationRenamed {
    name: String,
}

/// What the handlers reach through the registry: the control database, and a log of what
/// they did.
#[derive(Clone)]
struct Control {
    pool: SqlitePool,
    log: Arc<Mutex<Vec<String>>>,
}

impl Control {
    fn note(&self, line: String) {
        println!("relay:   {line}");
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }
}

/// A project exists in the cell: copy its current state to control.
#[outbox_handler]
async fn replicate_project(
    replication: Replication<Project>,
    State(control): State<Control>,
) -> Result<(), BoxError> {
    let project = replication.object;
    sqlx::query(
        "INSERT INTO projects (id, organization_id, name) VALUES (?, ?, ?) \
         ON CONFLICT (id) DO UPDATE SET name = excluded.name",
    )
    .bind(project.id)
    .bind(project.organization_id)
    .bind(&project.name)
    .execute(&control.pool)
    .await?;
    control.note(format!(
        "replicated project {} {:?}",
        project.id, project.name
    ));
    Ok(())
}

/// A project is gone from the cell: remove its copy (idempotently: it may be gone already).
#[outbox_handler]
async fn delete_project(
    deletion: Deletion<Project>,
    State(control): State<Control>,
) -> Result<(), BoxError> {
    sqlx::query("DELETE FROM projects WHERE id = ?")
        .bind(deletion.key()?)
        .execute(&control.pool)
        .await?;
    control.note(format!("deleted project {}", deletion.object_identifier));
    Ok(())
}

/// An organization was renamed: record its new name in control.
#[outbox_handler]
async fn rename_organization(
    delivery: Delivery<OrganizationRenamed>,
    State(control): State<Control>,
) -> Result<(), BoxError> {
    sqlx::query(
        "INSERT INTO organizations (id, name) VALUES (?, ?) \
         ON CONFLICT (id) DO UPDATE SET name = excluded.name",
    )
    .bind(i64::try_from(delivery.object_identifier)?)
    .bind(&delivery.payload.name)
    .execute(&control.pool)
    .await?;
    control.note(format!(
        "organization {} is now {:?}",
        delivery.object_identifier, delivery.payload.name
    ));
    Ok(())
}

const SCHEMA: [&str; 2] = [
    "CREATE TABLE organizations (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
    "CREATE TABLE projects (id INTEGER PRIMARY KEY, organization_id INTEGER NOT NULL, name TEXT NOT NULL)",
];

async fn create_schema(pool: &SqlitePool) -> Result<(), BoxError> {
    for statement in SCHEMA {
        sqlx::query(statement).execute(pool).await?;
    }
    Ok(())
}

fn project(id: i64, name: &str) -> Project {
    Project {
        id,
        organization_id: 1,
        name: name.into(),
    }
}

/// What the quickstart did.
#[derive(Debug)]
struct Summary {
    /// What the handlers did, in order.
    log: Vec<String>,
    /// Outbox messages pending before each relay run.
    pending: [usize; 2],
    /// Handler calls of each relay run.
    deliveries: [u64; 2],
    /// `(id, name)` of the projects in the control database at the end.
    control_projects: Vec<(i64, String)>,
}

/// Runs the story in `dir`; also returns its relay.
async fn run(dir: &Path) -> Result<(Summary, Relay<SqliteStore>), BoxError> {
    println!(
        "outbox quickstart: cell and control databases in {}",
        dir.display()
    );
    let cell = outbox::sqlite::connect(&dir.join("cell.db")).await?;
    outbox::sqlite::migrate(&cell).await?;
    create_schema(&cell).await?;
    let control = Control {
        pool: outbox::sqlite::connect(&dir.join("control.db")).await?,
        log: Arc::default(),
    };
    create_schema(&control.pool).await?;

    // Every declaration in this binary, checked: each category has its handlers, and each
    // handler's `State<Control>` is given.
    let registry = Registry::builder()
        .discovered()
        .state(control.clone())
        .build()?;
    let store = SqliteStore::new(cell.clone());
    let relay = Relay::new(store.clone(), registry);

    // The service writes; each change's outbox commits (or rolls back) with it.
    let mut tx = cell.begin().await?;
    outbox::sqlite::insert(
        &mut tx,
        &[
            project(10, "website"),
            project(11, "api"),
            project(12, "legacy"),
        ],
    )
    .await?;
    let renamed = OrganizationRenamed {
        name: "Acme".into(),
    };
    outbox::sqlite::write(
        &mut *tx,
        &Message::new::<OrganizationRenamed>(1, 1, &renamed)?,
    )
    .await?;
    tx.commit().await?;
    println!("cell:    created projects 10, 11 and 12 of organization 1, named it \"Acme\"");

    let pending_first = store.pending_messages(1000).await?.len();
    let first = relay.drain().await?;

    for name in ["website v2", "website v3", "website v4"] {
        let mut tx = cell.begin().await?;
        outbox::sqlite::update(&mut tx, &project(10, name)).await?;
        tx.commit().await?;
        println!("cell:    renamed project 10 to {name:?}");
    }
    let mut tx = cell.begin().await?;
    outbox::sqlite::delete(&mut tx, &project(12, "legacy")).await?;
    tx.commit().await?;
    println!("cell:    deleted project 12");
    let mut tx = cell.begin().await?;
    outbox::sqlite::insert(&mut tx, &project(13, "never saved")).await?;
    tx.rollback().await?;
    println!("cell:    created project 13 and rolled back: no row, no outbox");

    let pending_second = store.pending_messages(1000).await?.len();
    let second = relay.drain().await?;

    let control_projects = sqlx::query_as("SELECT id, name FROM projects ORDER BY id")
        .fetch_all(&control.pool)
        .await?;
    let log = control
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let summary = Summary {
        log,
        pending: [pending_first, pending_second],
        deliveries: [first.deliveries, second.deliveries],
        control_projects,
    };
    Ok((summary, relay))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let serve = std::env::args().skip(1).any(|arg| arg == "--serve");
    let dir = tempfile::tempdir()?;
    let (summary, relay) = run(dir.path()).await?;
    for (run, (pending, deliveries)) in summary.pending.iter().zip(summary.deliveries).enumerate() {
        println!(
            "relay:   run {}: {deliveries} deliveries for {pending} messages",
            run + 1
        );
    }
    println!(
        "control: projects {:?}, after {} handler calls",
        summary.control_projects,
        summary.log.len()
    );
    if serve {
        // What a service does: the background relay, until the process is asked to stop
        // (from this call on, SIGTERM and Ctrl-C are the relay's, and no longer kill it).
        let stop = shutdown_signal();
        println!("relay:   running until SIGTERM or Ctrl-C");
        let report = relay.run(stop).await?;
        println!(
            "relay:   stopped gracefully after {} deliveries",
            report.deliveries
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replicates_coalesces_renames_and_deletes() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (summary, _relay) = run(dir.path()).await.expect("the quickstart runs");

        assert_eq!(
            summary.pending,
            [4, 4],
            "3 projects + 1 rename; 3 renames + 1 delete"
        );
        assert_eq!(summary.deliveries, [4, 2], "the three renames coalesce");
        assert_eq!(
            summary.log,
            [
                r#"replicated project 10 "website""#,
                r#"replicated project 11 "api""#,
                r#"replicated project 12 "legacy""#,
                r#"organization 1 is now "Acme""#,
                r#"replicated project 10 "website v4""#,
                "deleted project 12",
            ]
        );
        assert_eq!(
            summary.control_projects,
            [(10, "website v4".to_owned()), (11, "api".to_owned())]
        );
    }
}
