//! Replicated models: rows written together with their outboxes, each field bound as its own
//! type, one statement per table (per as many rows as the database takes parameters).

use std::any::TypeId;
use std::collections::{BTreeSet, HashSet};
use std::sync::{Mutex, PoisonError};

use outbox_core::{Error, IntoModelBatch, Message, MessageId, ModelBatch, ReplicatedModel};

use outbox_core::columns::{ColumnVisitor, ModelColumns};

use outbox_core::error::ColumnMismatch;

use outbox_core::handler::BoxFuture;

use outbox_core::replicated::{ModelTable, check_model_shape};
use sqlx::error::BoxDynError;
use sqlx::{
    Arguments, AssertSqlSafe, Column, Database, Encode, Pool, Row, Transaction, Type, TypeInfo,
};

use crate::dialect::Dialect;
use crate::error::{database, on_table};
pub use crate::model_sql::{Write, column_list, columns_sql, model_sql, quoted};
use crate::sql::Runner;
use crate::write::write_all;

/// What a model's columns are visited for: binding a write's values, or checking the model's
/// field types against its table's column types.
enum Work<D: Dialect> {
    Bind {
        arguments: <D::Database as Database>::Arguments,
        error: Option<BoxDynError>,
    },
    Check {
        columns: Vec<(String, <D::Database as Database>::TypeInfo)>,
        mismatch: Option<ColumnMismatch>,
    },
}

/// The visitor of a model's columns for backend `D` (see [`ModelColumns`]): binds each
/// field's value as its own type, or checks each field's type against its column's. A
/// model is written by a backend if this visitor takes every field's type: if the driver
/// encodes it.
pub struct Columns<D: Dialect> {
    work: Work<D>,
}

impl<D: Dialect> Columns<D> {
    fn binder() -> Self {
        Self {
            work: Work::Bind {
                arguments: Default::default(),
                error: None,
            },
        }
    }

    fn into_arguments(self) -> Result<<D::Database as Database>::Arguments, BoxDynError> {
        match self.work {
            Work::Bind {
                error: Some(error), ..
            } => Err(error),
            Work::Bind { arguments, .. } => Ok(arguments),
            Work::Check { .. } => Ok(Default::default()),
        }
    }
}

impl<D, T> ColumnVisitor<T> for Columns<D>
where
    D: Dialect,
    T: for<'t> Encode<'t, D::Database> + Type<D::Database>,
{
    fn value(&mut self, _column: &'static str, value: &T) {
        if let Work::Bind {
            arguments,
            error: error @ None,
        } = &mut self.work
            && let Err(failed) = arguments.add(value)
        {
            *error = Some(failed);
        }
    }

    fn column(&mut self, column: &'static str) {
        let Work::Check {
            columns,
            mismatch: mismatch @ None,
        } = &mut self.work
        else {
            return;
        };
        match columns.iter().find(|(name, _)| name == column) {
            None => {
                *mismatch = Some(ColumnMismatch::MissingColumn {
                    field: column,
                    column,
                });
            }
            Some((_, found)) => {
                if !D::column_accepts(&T::type_info(), found, T::compatible(found)) {
                    *mismatch = Some(ColumnMismatch::IncompatibleType {
                        field: column,
                        column,
                        field_type: std::any::type_name::<T>(),
                        column_type: found.name().to_owned(),
                    });
                }
            }
        }
    }
}

/// A replicated model that backend `D` writes: every field of a type the driver encodes.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be written by this backend: a field's type is not one its \
               database driver encodes",
    label = "a model with a field the database cannot hold",
    note = "the error on `ColumnVisitor` names the field's type; enable the `sqlx` feature \
            that encodes it, or implement `sqlx::Type` and `sqlx::Encode` for it"
)]
pub trait Writable<D: Dialect>: ReplicatedModel + ModelColumns<Columns<D>> {}

impl<D: Dialect, M: ReplicatedModel + ModelColumns<Columns<D>>> Writable<D> for M {}

/// Compares model `M` with its table: every field has its column, of a type that holds the
/// field's values as they are. Fails with [`Error::ModelMismatch`] naming the model, the
/// field, the column and both types. One statement; once it has passed, the model's writes in
/// this process do not check again.
pub async fn check_model<D, M, R>(runner: &mut R) -> Result<(), Error>
where
    D: Dialect,
    M: Writable<D>,
    R: Runner<Database = D::Database>,
{
    let mismatch = |mismatch| Error::ModelMismatch {
        model: M::NAME,
        table: M::TABLE.table,
        mismatch,
    };
    let found = match table_columns::<D, R>(runner, &M::TABLE).await? {
        Some(found) => found,
        None => return Err(mismatch(ColumnMismatch::NoTable)),
    };
    let mut columns = Columns::<D> {
        work: Work::Check {
            columns: found,
            mismatch: None,
        },
    };
    M::visit_columns(&mut columns);
    match columns.work {
        Work::Check {
            mismatch: Some(found),
            ..
        } => Err(mismatch(found)),
        _ => {
            CHECKED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(checked::<D, M>());
            Ok(())
        }
    }
}

/// What [`CHECKED`] records of a model checked for a backend.
fn checked<D: Dialect, M: 'static>() -> (TypeId, &'static str) {
    (TypeId::of::<M>(), D::NAME)
}

/// The columns of `table` with their types; `None` if there is no such table.
async fn table_columns<D, R>(
    runner: &mut R,
    table: &ModelTable,
) -> Result<Option<Vec<(String, <D::Database as Database>::TypeInfo)>>, Error>
where
    D: Dialect,
    R: Runner<Database = D::Database>,
{
    const OPERATION: &str = "checking a replicated model's table";
    if let Some(refresh) = D::REFRESH_SCHEMA {
        sqlx::query(refresh)
            .execute(runner.executor())
            .await
            .map_err(database::<D>(OPERATION))?;
    }
    // Not kept as a prepared statement: the table may change between two checks.
    let row = sqlx::query(AssertSqlSafe(D::columns_sql(table)))
        .persistent(false)
        .fetch_one(runner.executor())
        .await;
    match row {
        Ok(row) => Ok(Some(
            row.columns()
                .iter()
                .map(|column| (column.name().to_owned(), column.type_info().clone()))
                .collect(),
        )),
        Err(sqlx::Error::Database(error)) if D::is_missing_table(&*error) => Ok(None),
        Err(error) => Err(database::<D>(OPERATION)(error)),
    }
}

/// [`check_model`] on a connection of `pool`.
pub async fn check_pooled<D: Dialect, M: Writable<D>>(
    pool: &Pool<D::Database>,
) -> Result<(), Error> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(database::<D>("checking a replicated model's table"))?;
    check_model::<D, M, _>(&mut conn).await
}

/// The models whose tables were checked in this process (by type and backend), by
/// [`check_model`] or before their first write.
static CHECKED: Mutex<BTreeSet<(TypeId, &'static str)>> = Mutex::new(BTreeSet::new());

/// The models whose serde form was checked in this process (it needs a model: only a write
/// checks it).
static SHAPED: Mutex<BTreeSet<TypeId>> = Mutex::new(BTreeSet::new());

/// Whether `set` holds `key`.
fn holds<K: Ord>(set: &Mutex<BTreeSet<K>>, key: &K) -> bool {
    set.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(key)
}

/// Checks the shape of `first` (its serde form has exactly the table's columns) and `M`
/// against its table, each unless this process has already.
async fn check_once<D, M, R>(runner: &mut R, first: &M) -> Result<(), Error>
where
    D: Dialect,
    M: Writable<D>,
    R: Runner<Database = D::Database>,
{
    let model = TypeId::of::<M>();
    if !holds(&SHAPED, &model) {
        check_model_shape(first)?;
        SHAPED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(model);
    }
    if !holds(&CHECKED, &checked::<D, M>()) {
        check_model::<D, M, R>(runner).await?;
    }
    Ok(())
}

/// What a model write did.
#[derive(Debug)]
pub struct Written {
    /// Rows of the model's table affected.
    pub rows: u64,
    /// The outbox messages written.
    pub messages: Vec<Message>,
    /// Their ids.
    pub ids: Vec<MessageId>,
}

/// Refuses a batch that names one key twice: one behaviour on every backend (a database would
/// otherwise refuse it, or keep one of the two rows, or update by either), and one outbox per
/// object and write.
fn distinct_keys<M: ReplicatedModel>(batch: &ModelBatch<'_, M>) -> Result<(), Error> {
    if batch.models().len() < 2 {
        return Ok(());
    }
    let mut seen = HashSet::with_capacity(batch.models().len());
    for model in batch.models() {
        let key = model.object_identifier();
        if !seen.insert(key) {
            return Err(Error::DuplicateKey {
                model: M::NAME,
                key,
            });
        }
    }
    Ok(())
}

/// Applies `write` to `batch`: the rows and one outbox per model (and destination), two
/// statements, the rows first.
///
/// The outboxes are written after the change they announce, deletions included: the change
/// takes the rows' locks, so a second writer of the same object waits for the first to commit
/// before it writes its own outbox, and the outbox ids of one object follow the order in which
/// its writers commit. Written first, a deletion's outbox would take its id before waiting on
/// the lock of a writer that then commits ahead of it: the older id would carry the newer
/// change. (The relay does not rely on it: it acknowledges only the rows it read.)
pub async fn apply<D, M, R>(
    runner: &mut R,
    write: Write,
    batch: &ModelBatch<'_, M>,
) -> Result<Written, Error>
where
    D: Dialect,
    M: Writable<D>,
    R: Runner<Database = D::Database>,
{
    let Some(first) = batch.models().first() else {
        return Ok(Written {
            rows: 0,
            messages: Vec::new(),
            ids: Vec::new(),
        });
    };
    distinct_keys(batch)?;
    check_once::<D, M, R>(runner, first).await?;
    let messages = batch.messages()?;
    let mut rows = 0;
    // As many rows per statement as the database takes parameters (a deletion binds keys).
    let width = match write {
        Write::Delete => 1,
        _ => M::TABLE.columns.len().max(1),
    };
    for chunk in batch.models().chunks((D::MAX_PARAMETERS / width).max(1)) {
        let mut columns = Columns::<D>::binder();
        for model in chunk {
            match write {
                Write::Delete => model.visit_key(&mut columns),
                _ => model.visit_values(&mut columns),
            }
        }
        let sql = AssertSqlSafe(D::model_sql(write, &M::TABLE, chunk.len()));
        let arguments = columns
            .into_arguments()
            .map_err(|error| on_table::<D>(write.operation())(sqlx::Error::Encode(error)))?;
        let done = sqlx::query_with(sql, arguments)
            .execute(runner.executor())
            .await
            .map_err(on_table::<D>(write.operation()))?;
        rows += D::model_rows_written(write, chunk.len(), D::rows_affected(&done));
    }
    let ids = write_all::<D, _>(runner.executor(), &messages).await?;
    Ok(Written {
        rows,
        messages,
        ids,
    })
}

/// Where a model write runs: in the caller's transaction (its statements join it, and commit
/// or roll back with it), or on a connection or a pool, in a transaction of its own that
/// commits before the write returns (the rows and their outboxes together, or neither).
pub enum Target<'c, 't, D: Dialect> {
    /// The caller's transaction.
    Transaction(&'c mut Transaction<'t, D::Database>),
    /// A connection (in a transaction of the caller's, the write's own is a savepoint).
    Connection(&'c mut <D::Database as Database>::Connection),
    /// A pool.
    Pool(&'c Pool<D::Database>),
}

impl<D: Dialect> std::fmt::Debug for Target<'_, '_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Transaction(_) => "Target::Transaction",
            Target::Connection(_) => "Target::Connection",
            Target::Pool(_) => "Target::Pool",
        })
    }
}

/// What the model writes take, as `write` takes an executor: `&mut Transaction`, the
/// backend's `&mut` connection, or `&Pool`.
#[diagnostic::on_unimplemented(
    message = "a model write runs on `&mut Transaction`, a `&mut` connection or a `&Pool` of \
               its database, not `{Self}`",
    label = "not a transaction, connection or pool of this backend"
)]
pub trait ModelTarget<'c, 't, D: Dialect>: Send {
    /// Where the write runs.
    fn target(self) -> Target<'c, 't, D>;
}

impl<'c, 't, D: Dialect> ModelTarget<'c, 't, D> for &'c mut Transaction<'t, D::Database> {
    fn target(self) -> Target<'c, 't, D> {
        Target::Transaction(self)
    }
}

impl<'c, D: Dialect> ModelTarget<'c, 'static, D> for &'c Pool<D::Database> {
    fn target(self) -> Target<'c, 'static, D> {
        Target::Pool(self)
    }
}

/// [`apply`] where `target` says: in the caller's transaction, or in one of its own.
pub async fn apply_to<'c, 't: 'c, D, M>(
    target: impl ModelTarget<'c, 't, D>,
    write: Write,
    batch: &ModelBatch<'_, M>,
) -> Result<Written, Error>
where
    D: Dialect,
    M: Writable<D>,
{
    let mut own = match target.target() {
        Target::Transaction(tx) => return apply::<D, M, _>(tx, write, batch).await,
        Target::Connection(conn) => sqlx::Connection::begin(conn).await,
        Target::Pool(pool) => pool.begin().await,
    }
    .map_err(database::<D>("beginning a transaction"))?;
    let written = apply::<D, M, _>(&mut own, write, batch).await?;
    own.commit()
        .await
        .map_err(database::<D>("committing a model write"))?;
    Ok(written)
}

/// `write` where `target` says, the models converted at the call (so that a mistake there is
/// one error).
pub fn boxed<'f, 'c: 'f, 't: 'c, 'a: 'f, D: Dialect, M: Writable<D>>(
    target: impl ModelTarget<'c, 't, D> + 'f,
    write: Write,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'f, Result<u64, Error>> {
    let batch = models.into_batch();
    Box::pin(async move {
        let written = apply_to::<D, M>(target, write, &batch).await?;
        Ok(written.rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_part_by_part() {
        assert_eq!(quoted("app.projects"), "\"app\".\"projects\"");
        assert_eq!(quoted("we\"ird"), "\"we\"\"ird\"");
        let table = ModelTable {
            table: "projects",
            key: "id",
            columns: &["id", "name"],
        };
        assert_eq!(column_list(&table), "\"id\", \"name\"");
    }
}
