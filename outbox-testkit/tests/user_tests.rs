//! Tests as a user writes them: a replicated model declared with the macros, written in a test
//! database, delivered by `outbox_runner`, and the handler's effect asserted, on SQLite and on
//! PostgreSQL, in a few lines each.

use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{
    BoxError, Deletion, Registry, Replication, State, outbox_handler, outbox_scope,
    replicated_model,
};
use outbox_testkit::outbox_runner;
use outbox_testkit::postgres::PgTestDatabase;
use outbox_testkit::sqlite::SqliteTestDatabase;
use serde::{Deserialize, Serialize};

#[outbox_scope(id = 1)]
struct Organization;

#[replicated_model(scope = Organization, id = 1, table = "projects", shard = organization_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
    name: String,
}

const PROJECTS: &str = "CREATE TABLE projects (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, name TEXT NOT NULL)";

/// The "other silo" the handlers replicate to: project names by id.
#[derive(Clone, Default)]
struct Copies(Arc<Mutex<Vec<(i64, String)>>>);

impl Copies {
    fn names(&self) -> Vec<(i64, String)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn edit(&self, edit: impl FnOnce(&mut Vec<(i64, String)>)) {
        edit(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn registry(&self) -> Registry {
        Registry::builder()
            .discovered()
            .state(self.clone())
            .build()
            .expect("the declarations are consistent")
    }
}

#[outbox_handler]
async fn replicate(
    replication: Replication<Project>,
    State(copies): State<Copies>,
) -> Result<(), BoxError> {
    let project = replication.object;
    copies.edit(|copies| {
        copies.retain(|(id, _)| *id != project.id);
        copies.push((project.id, project.name));
    });
    Ok(())
}

#[outbox_handler]
async fn delete(deletion: Deletion<Project>, State(copies): State<Copies>) -> Result<(), BoxError> {
    copies.edit(|copies| copies.retain(|(id, _)| *id != deletion.object_identifier));
    Ok(())
}

fn project(id: i64, name: &str) -> Project {
    Project {
        id,
        organization_id: 7,
        name: name.into(),
    }
}

#[outbox_testkit::test]
async fn saving_a_project_replicates_it_on_sqlite(db: SqliteTestDatabase) -> Result<(), BoxError> {
    db.execute(PROJECTS).await;
    let copies = Copies::default();
    outbox_runner(&db.relay(copies.registry()), async {
        let mut tx = outbox_sqlite::begin(db.pool()).await?;
        tx.save(&project(1, "api")).await?;
        tx.commit().await
    })
    .await?;
    assert_eq!(copies.names(), [(1, "api".to_owned())]);
    Ok(())
}

#[outbox_testkit::test]
async fn saving_a_project_replicates_it_on_postgres(db: PgTestDatabase) -> Result<(), BoxError> {
    db.execute(PROJECTS).await;
    let copies = Copies::default();
    outbox_runner(&db.relay(copies.registry()), async {
        let mut tx = outbox_postgres::begin(db.pool()).await?;
        tx.save(&project(1, "api")).await?;
        tx.commit().await
    })
    .await?;
    assert_eq!(copies.names(), [(1, "api".to_owned())]);
    Ok(())
}

#[outbox_testkit::test]
async fn deleting_a_project_removes_its_copy(db: PgTestDatabase) -> Result<(), BoxError> {
    db.execute(PROJECTS).await;
    let copies = Copies::default();
    let relay = db.relay(copies.registry());
    outbox_runner(&relay, async {
        let mut tx = outbox_postgres::begin(db.pool()).await?;
        tx.save(&[project(1, "api"), project(2, "web")]).await?;
        tx.commit().await
    })
    .await?;
    outbox_runner(&relay, async {
        let mut tx = outbox_postgres::begin(db.pool()).await?;
        tx.delete(&project(1, "api")).await?;
        tx.commit().await
    })
    .await?;
    assert_eq!(copies.names(), [(2, "web".to_owned())]);
    Ok(())
}

/// Flush-after-commit in a user's code: the caller learns at once that the copy was made.
#[outbox_testkit::test]
async fn a_flushed_save_is_replicated_before_the_call_returns(
    db: SqliteTestDatabase,
) -> Result<(), BoxError> {
    db.execute(PROJECTS).await;
    let copies = Copies::default();
    let relay = db.relay(copies.registry());
    let mut tx = outbox_sqlite::begin(db.pool()).await?;
    tx.save(&project(1, "api")).await?;
    relay.flush(&tx.commit().await?).await?;
    assert_eq!(copies.names(), [(1, "api".to_owned())]);
    Ok(())
}
