//! Scenario 7: replicated-model writes. One transaction saves 100 models (each field bound as
//! its own type) with their 100 outboxes, against the fastest plain SQL for the same work: the
//! rows upserted from one array per column (`unnest`), the outboxes inserted the same way.

use std::time::Duration;

use outbox_core::{Category, CategoryId, Id, LocalModel, ReplicatedModel};

use outbox_core::columns::{ColumnVisitor, ModelColumns};

use outbox_core::replicated::ModelTable;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Accounts, Server, failed};
use super::write::{Side, compare, concurrently};

const MODELS_PER_TRANSACTION: i64 = 100;

const UPSERT_PG: &str = "INSERT INTO projects (id, organization_id, name, archived) \
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::boolean[]) \
    ON CONFLICT (id) DO UPDATE SET organization_id = EXCLUDED.organization_id, \
    name = EXCLUDED.name, archived = EXCLUDED.archived";
const OUTBOXES_PG: &str = "INSERT INTO outbox_messages \
    (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    SELECT 1, shard, '', 2, object, 'null'::jsonb \
    FROM unnest($1::bigint[], $2::bigint[]) AS rows(shard, object)";

/// The benchmark's replicated model (its traits written out, as `#[replicated_model]` would).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Project {
    id: i64,
    organization_id: i64,
    name: String,
    archived: bool,
}

impl Category for Project {
    type Scope = Accounts;
    type Payload = ();
    const ID: CategoryId = CategoryId(2);
    const NAME: &'static str = "project";
}

impl ReplicatedModel for Project {
    const TABLE: ModelTable = ModelTable {
        table: "projects",
        key: "id",
        columns: &["id", "organization_id", "name", "archived"],
    };
    type Key = i64;

    fn object_identifier(&self) -> Id {
        Id::integer(self.id)
    }

    fn shard_identifier(&self) -> Id {
        Id::integer(self.organization_id)
    }

    fn tombstone(&self) -> Self::Payload {}

    /// Version 2: scenario 10's backfill walks version 1, then version 2.
    const REPLICATION_VERSION: u32 = 2;
}

impl LocalModel for Project {}

impl<V> ModelColumns<V> for Project
where
    V: ?Sized + ColumnVisitor<i64> + ColumnVisitor<String> + ColumnVisitor<bool>,
{
    fn visit_values(&self, visitor: &mut V) {
        ColumnVisitor::<i64>::value(visitor, "id", &self.id);
        ColumnVisitor::<i64>::value(visitor, "organization_id", &self.organization_id);
        ColumnVisitor::<String>::value(visitor, "name", &self.name);
        ColumnVisitor::<bool>::value(visitor, "archived", &self.archived);
    }

    fn visit_columns(visitor: &mut V) {
        ColumnVisitor::<i64>::column(visitor, "id");
        ColumnVisitor::<i64>::column(visitor, "organization_id");
        ColumnVisitor::<String>::column(visitor, "name");
        ColumnVisitor::<bool>::column(visitor, "archived");
    }

    fn visit_key(&self, visitor: &mut V) {
        ColumnVisitor::<i64>::value(visitor, "id", &self.id);
    }
}

/// PostgreSQL: 8 connections, each transaction saving 100 models of one organization.
pub(crate) async fn postgres(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let workers = 8u64;
    let database = server.database(workers as u32 + 2).await?;
    let pool = database.pool.clone();
    sqlx::raw_sql(
        "CREATE TABLE projects (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, \
         name TEXT NOT NULL, archived BOOLEAN NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(failed("creating the projects"))?;
    let transactions = args.sized(2_000, 40) / workers * workers;
    let models = transactions * MODELS_PER_TRANSACTION as u64;
    let (engine, baseline) = compare(models, |side| {
        save_pg(pool.clone(), side, workers, transactions / workers)
    })
    .await?;
    database.drop_database().await?;
    Ok(vec![Row::compared(
        "7. models: save 100 models + outboxes per transaction, 8 connections (PostgreSQL)",
        "models/s",
        engine,
        baseline,
        Target::None,
    )])
}

async fn save_pg(pool: PgPool, side: Side, workers: u64, each: u64) -> Result<Duration, String> {
    sqlx::raw_sql("TRUNCATE outbox_messages; TRUNCATE projects")
        .execute(&pool)
        .await
        .map_err(failed("emptying the tables"))?;
    concurrently(&pool, workers, each, move |pool, worker, i| async move {
        // Half new rows, half updates of the previous transaction's.
        let organization = (worker * each + i) as i64;
        let first = organization * MODELS_PER_TRANSACTION / 2;
        let projects: Vec<Project> = (first..first + MODELS_PER_TRANSACTION)
            .map(|id| Project {
                id,
                organization_id: organization,
                name: format!("project {id}"),
                archived: id % 2 == 0,
            })
            .collect();
        let mut tx = pool.begin().await.map_err(failed("begin"))?;
        match side {
            Side::Engine => {
                outbox_postgres::save(&mut tx, &projects)
                    .await
                    .map_err(failed("save"))?;
            }
            Side::Baseline => {
                let ids: Vec<i64> = projects.iter().map(|p| p.id).collect();
                sqlx::query(UPSERT_PG)
                    .bind(&ids)
                    .bind(vec![organization; projects.len()])
                    .bind(projects.iter().map(|p| p.name.clone()).collect::<Vec<_>>())
                    .bind(projects.iter().map(|p| p.archived).collect::<Vec<_>>())
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("upsert"))?;
                sqlx::query(OUTBOXES_PG)
                    .bind(vec![organization; projects.len()])
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("outboxes"))?;
            }
        }
        tx.commit().await.map_err(failed("commit"))?;
        Ok(())
    })
    .await
}
