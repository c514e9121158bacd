//! Backfills on a `sqlx` database: a batch walked, its outboxes written and its
//! watermark moved in one transaction that holds the model's watermark row.

use outbox_core::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillOutcome, BackfillStart, BackfillState,
    BackfillStep, batch_size, destinations_from_json, destinations_json,
};
use outbox_core::{CategoryId, Error, Id};
use sqlx::{AssertSqlSafe, Database};

use crate::dialect::Dialect;
use crate::error::{database, on_table};
use crate::session::{Writer, with_key};
use crate::sql::{Executes, With, get};
use crate::store::{SqlxStore, from_ms};
use crate::write::write_all;

const WALKING: &str = "walking a backfill";

/// A watermark row (see [`BackfillStatements`](crate::BackfillStatements)) as a state.
fn watermark<D: Dialect>(row: &<D::Database as Database>::Row) -> Result<BackfillState, Error> {
    let failed = database::<D>("reading a backfill's watermark");
    let version = |index| {
        get::<D::Database, i32>(row, index).map(|version| u32::try_from(version).unwrap_or(0))
    };
    let time = |index| get::<D::Database, Option<i64>>(row, index).map(|ms| ms.map(from_ms));
    let read = || -> Result<(BackfillState, Option<String>, Option<String>), sqlx::Error> {
        let mut state = BackfillState::new(
            CategoryId(get::<D::Database, i32>(row, 0)?),
            get::<D::Database, String>(row, 1)?,
        );
        state.declared_version = version(2)?;
        state.target_version = version(3)?;
        state.walking_version = version(4)?;
        state.done_version = version(5)?;
        let low_bound = get::<D::Database, Option<String>>(row, 6)?;
        state.rows_walked = u64::try_from(get::<D::Database, i64>(row, 7)?).unwrap_or(0);
        let destinations = get::<D::Database, Option<String>>(row, 8)?;
        state.worker = get::<D::Database, Option<String>>(row, 9)?;
        state.started_at = time(10)?;
        state.updated_at = time(11)?;
        state.completed_at = time(12)?;
        state.last_error = get::<D::Database, Option<String>>(row, 13)?;
        Ok((state, low_bound, destinations))
    };
    let (mut state, low_bound, destinations) = read().map_err(failed)?;
    state.low_bound = low_bound
        .map(|text| {
            text.parse::<Id>().map_err(|error| Error::Undecodable {
                operation: "reading a backfill's watermark",
                message_id: None,
                detail: format!("its low bound {text:?}: {error}"),
            })
        })
        .transpose()?;
    state.destinations = destinations_from_json(destinations.as_deref())?;
    Ok(state)
}

fn flag(value: bool) -> i32 {
    i32::from(value)
}

fn version(version: u32) -> i32 {
    i32::try_from(version).unwrap_or(i32::MAX)
}

impl<D: Dialect> SqlxStore<D> {
    /// See [`Store::backfill`](outbox_core::store::Store::backfill).
    pub(crate) async fn backfill_tick(
        &self,
        model: &BackfillModel,
        options: &BackfillOptions,
    ) -> Result<BackfillBatch, Error> {
        let sql = &D::SQL.backfill;
        let recorded = self
            .backfill_states()
            .await?
            .into_iter()
            .find(|state| state.category == model.category);
        let declared = recorded.as_ref().is_some_and(|state| {
            state.model == model.name && state.declared_version >= model.version
        });
        let declares = recorded.as_ref().map_or(model.version, |state| {
            state.declared_version.max(model.version)
        });
        // Most ticks find nothing to do (not started, done, paused): seen by a read, they take
        // no write transaction (no row lock, no WAL flush; no write lock on SQLite).
        if let Some(idle) = recorded
            .filter(|state| declared && state.next_step(model.version) == BackfillStep::Gated)
        {
            return Ok(BackfillBatch {
                model: model.name,
                outcome: BackfillOutcome::Gated,
                state: Some(idle),
            });
        }
        let ensure = sqlx::query(sql.ensure)
            .with(model.category.0)
            .with(model.name);
        self.write(ensure, WALKING).await?;
        if !declared {
            // What this relay's code declares is recorded on its own, before any batch: a
            // batch that fails rolls back its own writes, not the declaration.
            let declare = sqlx::query(sql.declare)
                .with(model.category.0)
                .with(model.name)
                .with(version(declares));
            self.write(declare, WALKING).await?;
        }
        let mut writer = Writer::begin(&self.dialect, &self.pool, WALKING).await?;
        let locked = sqlx::query(sql.lock)
            .with(model.category.0)
            .fetch_optional(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(WALKING))?;
        let Some(row) = locked else {
            return Ok(BackfillBatch {
                model: model.name,
                outcome: BackfillOutcome::Busy,
                state: None,
            });
        };
        let walked = match watermark::<D>(&row) {
            Ok(state) => walk::<D>(&mut writer, model, options, state).await,
            Err(error) => Err(error),
        };
        let walked = match walked {
            Ok(walked) => writer
                .commit(WALKING)
                .await
                .map(|()| walked)
                .map_err(|source| Error::BackfillWatermark {
                    model: model.name,
                    source: Box::new(source),
                }),
            Err(error) => {
                // Rolled back, and the backend's turn given up, before the error is recorded.
                drop(writer);
                Err(error)
            }
        };
        match walked {
            Ok(batch) => {
                // Announced as "some, anywhere", not by shard: a relay finds a walk's
                // messages by sweeping, and drains them after the shards that commits name
                // (live traffic), which would otherwise wait behind a whole batch of the walk.
                if matches!(batch.outcome, BackfillOutcome::Walked { messages, .. } if messages > 0)
                {
                    crate::wake::committed::<D>(Some(&self.pool), &[]);
                }
                Ok(batch)
            }
            Err(error) => {
                // The batch rolled back; its error goes on the watermark, if the database
                // takes it.
                let text = outbox_core::error::error_chain(&error);
                let fail = sqlx::query(sql.fail).with(model.category.0).with(text);
                if let Err(unrecorded) = self.write(fail, "recording a backfill's error").await {
                    tracing::debug!(
                        model = model.name,
                        error = %outbox_core::error::error_chain(&unrecorded),
                        "could not record a backfill's error on its watermark"
                    );
                }
                Err(error)
            }
        }
    }

    /// See [`Admin::backfills`](outbox_core::admin::Admin::backfills).
    pub(crate) async fn backfill_states(&self) -> Result<Vec<BackfillState>, Error> {
        let rows = self
            .rows(sqlx::query(D::SQL.backfill.list), "listing backfills")
            .await?;
        rows.iter().map(watermark::<D>).collect()
    }

    /// See [`Admin::start_backfill`](outbox_core::admin::Admin::start_backfill).
    pub(crate) async fn begin_backfill(
        &self,
        start: &BackfillStart,
    ) -> Result<BackfillState, Error> {
        start.check()?;
        const OPERATION: &str = "starting a backfill";
        let mut writer = Writer::begin(&self.dialect, &self.pool, OPERATION).await?;
        let row = sqlx::query(D::SQL.backfill.start)
            .with(start.category.0)
            .with(start.model.clone().unwrap_or_default())
            .with(version(start.version))
            .with(destinations_json(start.destinations.as_deref()))
            .fetch_one(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?;
        let state = watermark::<D>(&row)?;
        writer.commit(OPERATION).await?;
        Ok(state)
    }

    /// See [`Admin::pause_backfill`](outbox_core::admin::Admin::pause_backfill).
    pub(crate) async fn halt_backfill(&self, category: CategoryId) -> Result<bool, Error> {
        let query = sqlx::query(D::SQL.backfill.pause).with(category.0);
        Ok(self.write(query, "pausing a backfill").await? > 0)
    }
}

/// In the transaction that holds the model's watermark: what its state calls for.
async fn walk<D: Dialect>(
    writer: &mut Writer<D>,
    model: &BackfillModel,
    options: &BackfillOptions,
    mut state: BackfillState,
) -> Result<BackfillBatch, Error> {
    let sql = &D::SQL.backfill;
    let declared = state.declared_version.max(model.version);
    let undeclared = state.model != model.name || state.declared_version != declared;
    model.name.clone_into(&mut state.model);
    state.declared_version = declared;
    let BackfillStep::Walk {
        version: walking,
        after,
    } = state.next_step(model.version)
    else {
        if undeclared {
            sqlx::query(sql.declare)
                .with(model.category.0)
                .with(model.name)
                .with(version(declared))
                .execute(D::Database::on(writer.conn()))
                .await
                .map_err(database::<D>(WALKING))?;
        }
        let batch = BackfillBatch {
            model: model.name,
            outcome: BackfillOutcome::Gated,
            state: Some(state),
        };
        return Ok(batch);
    };
    let bound = i64::try_from(options.budget).unwrap_or(i64::MAX);
    let backlog: i64 = sqlx::query(sql.backlog)
        .with(bound)
        .fetch_one(D::Database::on(writer.conn()))
        .await
        .and_then(|row| get::<D::Database, i64>(&row, 0))
        .map_err(database::<D>(WALKING))?;
    let size = batch_size(
        options.budget,
        usize::try_from(backlog).unwrap_or(usize::MAX),
    );
    let limit = i64::try_from(size).unwrap_or(i64::MAX);
    let walk_sql = AssertSqlSafe(D::walk_model_sql(
        &model.table,
        after.map(|key| key.as_wide().is_some()),
    ));
    let query = match after {
        None => sqlx::query(walk_sql),
        Some(key) => with_key(sqlx::query(walk_sql), key),
    };
    let rows = query
        .with(limit)
        .fetch_all(D::Database::on(writer.conn()))
        .await
        .map_err(on_table::<D>(WALKING))?;
    let mut messages = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in &rows {
        let read = D::read_model(row).map_err(on_table::<D>(WALKING))?;
        let walked = model.walk(&read, state.destinations.as_deref())?;
        messages.extend(walked.messages);
        last = Some(walked.key);
    }
    write_all::<D, _>(D::Database::on(writer.conn()), &messages).await?;
    let next = state.after_batch(
        walking,
        rows.len(),
        size,
        last,
        &options.worker,
        std::time::SystemTime::now(),
    );
    let started = state.walking_version != walking;
    let completed = next.done_version == walking && state.done_version != walking;
    let recorded = sqlx::query(sql.record)
        .with(model.category.0)
        .with(model.name)
        .with(version(declared))
        .with(version(next.walking_version))
        .with(version(next.done_version))
        .with(next.low_bound.map(|key| key.to_string()))
        .with(i64::try_from(next.rows_walked).unwrap_or(i64::MAX))
        .with(options.worker.clone())
        .with(flag(started))
        .with(flag(completed))
        .fetch_optional(D::Database::on(writer.conn()))
        .await
        .map_err(|error| Error::BackfillWatermark {
            model: model.name,
            source: Box::new(database::<D>("recording a backfill's watermark")(error)),
        })?;
    let Some(recorded) = recorded else {
        return Err(Error::BackfillWatermark {
            model: model.name,
            source: Box::new(Error::Database {
                operation: "recording a backfill's watermark",
                source: "the model's watermark row is gone".into(),
            }),
        });
    };
    let batch = BackfillBatch {
        model: model.name,
        outcome: BackfillOutcome::Walked {
            version: walking,
            size,
            rows: rows.len(),
            messages: messages.len(),
            complete: completed,
        },
        state: Some(watermark::<D>(&recorded)?),
    };
    Ok(batch)
}
