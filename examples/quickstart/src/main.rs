//! # outbox quickstart
//!
//! An organization/project service on SQLite, with no server to run. The **cell** database
//! holds the service's data; every save writes an outbox message in the same transaction as
//! the change. The relay then replicates the changes into a second, **control** database.
//! Three renames of one project coalesce into one delivery of its newest state.
//!
//! ```text
//! cargo run -p quickstart
//! ```

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::fmt::{self, Display};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{
    Category, CategoryId, Delivery, Handler, HandlerContext, Message, Registry, Relay, Scope,
    ScopeId, Store,
};
use outbox_sqlite::SqliteStore;
use serde::{Deserialize, Serialize};
use sqlx::{SqliteConnection, SqliteExecutor, SqlitePool};

/// Outboxes are sharded by organization: one organization's changes arrive in order.
struct Organization;

impl Scope for Organization {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "organization";
}

/// The replicated state of an organization.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrganizationState {
    id: i64,
    name: String,
}

/// The replicated state of a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProjectState {
    id: i64,
    organization_id: i64,
    name: String,
}

/// "Organization `object_identifier` changed": replicate it.
struct OrganizationUpdate;

impl Category for OrganizationUpdate {
    type Scope = Organization;
    type Payload = OrganizationState;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "organization_update";
}

/// "Project `object_identifier` changed": replicate it.
struct ProjectUpdate;

impl Category for ProjectUpdate {
    type Scope = Organization;
    type Payload = ProjectState;
    const ID: CategoryId = CategoryId(2);
    const NAME: &'static str = "project_update";
}

type BoxError = Box<dyn Error + Send + Sync>;

/// A row both databases store: written by the service in the cell, by the relay in control.
trait Model: Display + Send + Sync + 'static {
    /// Inserts or updates the row.
    fn upsert<'e>(
        &self,
        executor: impl SqliteExecutor<'e>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

impl Model for OrganizationState {
    async fn upsert<'e>(&self, executor: impl SqliteExecutor<'e>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO organizations (id, name) VALUES (?, ?) \
             ON CONFLICT (id) DO UPDATE SET name = excluded.name",
        )
        .bind(self.id)
        .bind(&self.name)
        .execute(executor)
        .await?;
        Ok(())
    }
}

impl Display for OrganizationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "organization {} {:?}", self.id, self.name)
    }
}

impl Model for ProjectState {
    async fn upsert<'e>(&self, executor: impl SqliteExecutor<'e>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO projects (id, organization_id, name) VALUES (?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET name = excluded.name",
        )
        .bind(self.id)
        .bind(self.organization_id)
        .bind(&self.name)
        .execute(executor)
        .await?;
        Ok(())
    }
}

impl Display for ProjectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "project {} {:?}", self.id, self.name)
    }
}

/// Saves an organization in the cell, announcing it in the same transaction.
async fn save_organization(
    cell: &SqlitePool,
    organization: &OrganizationState,
) -> Result<(), BoxError> {
    let mut tx = cell.begin().await?;
    organization.upsert(&mut *tx).await?;
    let message =
        Message::new::<OrganizationUpdate>(organization.id, organization.id, organization)?;
    outbox_sqlite::write(&mut *tx, &message).await?;
    tx.commit().await?;
    Ok(())
}

/// Saves a project on an open transaction, announcing it on the same transaction.
async fn save_project(tx: &mut SqliteConnection, project: &ProjectState) -> Result<(), BoxError> {
    project.upsert(&mut *tx).await?;
    let message = Message::new::<ProjectUpdate>(project.organization_id, project.id, project)?;
    outbox_sqlite::write(&mut *tx, &message).await?;
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

/// The handler of both categories: replicates the payload into the control database, and
/// notes what it replicated.
#[derive(Clone)]
struct Replicator {
    control: SqlitePool,
    log: Arc<Mutex<Vec<String>>>,
}

impl<C: Category> Handler<C> for Replicator
where
    C::Payload: Model,
{
    async fn handle(
        &self,
        delivery: Delivery<C>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), outbox_core::BoxError> {
        delivery.payload.upsert(&self.control).await?;
        let line = delivery.payload.to_string();
        println!("relay:   replicated {line} to control");
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
        Ok(())
    }
}

/// What the quickstart did.
#[derive(Debug)]
struct Summary {
    /// What the handlers replicated, in order.
    replicated: Vec<String>,
    /// Outbox messages pending before the relay ran.
    pending_before: usize,
    /// Outbox messages pending after it ran.
    pending_after: usize,
    /// Handler calls.
    deliveries: u64,
    /// `(id, organization, name)` of the projects in the control database.
    control_projects: Vec<(i64, i64, String)>,
}

async fn run(dir: &Path) -> Result<Summary, BoxError> {
    println!(
        "outbox quickstart: cell and control databases in {}",
        dir.display()
    );
    let cell = outbox_sqlite::connect(&dir.join("cell.db")).await?;
    outbox_sqlite::migrate(&cell).await?;
    create_schema(&cell).await?;
    let control = outbox_sqlite::connect(&dir.join("control.db")).await?;
    create_schema(&control).await?;

    // The service saves; each save's outbox message commits (or not) with it.
    let acme = OrganizationState {
        id: 1,
        name: "Acme".into(),
    };
    save_organization(&cell, &acme).await?;
    let mut website = ProjectState {
        id: 10,
        organization_id: acme.id,
        name: "website".into(),
    };
    let api = ProjectState {
        id: 11,
        organization_id: acme.id,
        name: "api".into(),
    };
    let mut tx = cell.begin().await?;
    save_project(&mut tx, &website).await?;
    save_project(&mut tx, &api).await?;
    tx.commit().await?;
    println!("cell:    saved organization 1 \"Acme\", projects 10 \"website\" and 11 \"api\"");

    for name in ["website v2", "website v3", "website v4"] {
        website.name = name.into();
        let mut tx = cell.begin().await?;
        save_project(&mut tx, &website).await?;
        tx.commit().await?;
        println!("cell:    renamed project 10 to {name:?}");
    }

    let mut tx = cell.begin().await?;
    let abandoned = ProjectState {
        id: 12,
        organization_id: acme.id,
        name: "never saved".into(),
    };
    save_project(&mut tx, &abandoned).await?;
    tx.rollback().await?;
    println!("cell:    a save of project 12 rolled back, and its outbox message with it");

    let store = SqliteStore::new(cell.clone());
    let pending_before = store.pending_messages(1000).await?.len();
    println!("cell:    {pending_before} outbox messages pending");

    // The relay delivers, coalesced per object, in order per organization.
    let replicator = Replicator {
        control: control.clone(),
        log: Arc::default(),
    };
    let registry = Registry::builder()
        .handle::<OrganizationUpdate>(replicator.clone())
        .handle::<ProjectUpdate>(replicator.clone())
        .build()?;
    let relay = Relay::new(store.clone(), registry);
    let report = relay.drain().await?;

    let pending_after = store.pending_messages(1000).await?.len();
    let control_projects =
        sqlx::query_as("SELECT id, organization_id, name FROM projects ORDER BY id")
            .fetch_all(&control)
            .await?;
    let replicated = replicator
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(Summary {
        replicated,
        pending_before,
        pending_after,
        deliveries: report.deliveries,
        control_projects,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let summary = run(dir.path()).await?;
    let coalesced = summary.pending_before as u64 - summary.deliveries;
    println!(
        "relay:   {} deliveries for {} messages: {coalesced} coalesced into their object's newest payload",
        summary.deliveries, summary.pending_before
    );
    let project_10 = summary
        .replicated
        .iter()
        .filter(|line| line.starts_with("project 10 "))
        .count();
    println!("control: project 10 saved 4 times in the cell, replicated {project_10} time(s)");
    println!("control: projects {:?}", summary.control_projects);
    println!("cell:    {} outbox messages pending", summary.pending_after);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replicates_with_three_renames_coalesced_into_one_delivery() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let summary = run(dir.path()).await.expect("the quickstart runs");

        assert_eq!(
            summary.pending_before, 6,
            "1 organization + 2 projects + 3 renames"
        );
        assert_eq!(summary.pending_after, 0);
        assert_eq!(summary.deliveries, 3);
        assert_eq!(
            summary.replicated,
            [
                r#"organization 1 "Acme""#,
                r#"project 10 "website v4""#,
                r#"project 11 "api""#,
            ]
        );
        assert_eq!(
            summary.control_projects,
            [(10, 1, "website v4".to_owned()), (11, 1, "api".to_owned())]
        );
    }
}
