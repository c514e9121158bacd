//! Replicated models with real column types, on both backends: each field is stored as exactly
//! its value (bytes as bytes, a UUID as a UUID, a timestamp as a timestamp) and read back at
//! delivery as it was written; a model that does not match its table is refused before
//! anything is written, with the model, field, column and both types named.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, TimeZone, Utc};
use outbox_core::error::ColumnMismatch;
use outbox_core::store::Store;
use outbox_core::{
    Deletion, Error, ModelBatch, Payload, Registry, ReplicatedModel, Replication, outbox_scope,
    replicated_model,
};
use outbox_sqlx::model::{Written, apply, check_pooled};
use outbox_sqlx::sql::{Decodes, Executes, get};
use outbox_sqlx::{Dialect, SqlxStore, Writable, Write};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[outbox_scope(id = 1)]
struct Org;

/// A column of every kind the issue names.
#[replicated_model(scope = Org, id = 1, table = "records", shard = org)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    id: i64,
    org: i64,
    data: Vec<u8>,
    uid: Uuid,
    at: DateTime<Utc>,
    amount: f64,
    flag: bool,
    note: Option<String>,
    maybe: Option<Vec<u8>>,
    doc: serde_json::Value,
}

const PG_RECORDS: &str = "CREATE TABLE records (id BIGINT PRIMARY KEY, org BIGINT NOT NULL, \
     data BYTEA NOT NULL, uid UUID NOT NULL, at TIMESTAMPTZ NOT NULL, amount NUMERIC NOT NULL, \
     flag BOOLEAN NOT NULL, note TEXT, maybe BYTEA, doc JSONB NOT NULL)";

const SQLITE_RECORDS: &str = "CREATE TABLE records (id INTEGER PRIMARY KEY, \
     org INTEGER NOT NULL, data BLOB NOT NULL, uid BLOB NOT NULL, at DATETIME NOT NULL, \
     amount NUMERIC NOT NULL, flag BOOLEAN NOT NULL, note TEXT, maybe BLOB, doc JSON NOT NULL)";

fn record(id: i64) -> Record {
    Record {
        id,
        org: 7,
        data: vec![1, 2, 3, 0, 255],
        uid: Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0 + id as u128),
        at: Utc
            .with_ymd_and_hms(2026, 11, 23, 18, 30, 15)
            .single()
            .expect("a time")
            + chrono::Duration::microseconds(123_456),
        amount: 12.5,
        flag: id % 2 == 0,
        note: None,
        maybe: None,
        doc: serde_json::json!({"tags": ["a", "b"], "level": 3}),
    }
}

type Seen = Arc<Mutex<Vec<Record>>>;

fn registry(seen: &Seen) -> Registry {
    let seen = Arc::clone(seen);
    Registry::builder()
        .replication::<Record>(move |r: Replication<Record>| {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(r.object);
            async { Ok::<_, outbox_core::BoxError>(()) }
        })
        .deletion::<Record>(|_: Deletion<Record>| async { Ok::<_, outbox_core::BoxError>(()) })
        .build()
        .expect("a registry")
}

async fn write<P: Provision>(
    database: &SqlxTestDatabase<P>,
    write: Write,
    models: &[Record],
) -> Result<Written, Error>
where
    Record: Writable<P::Dialect>,
{
    let mut tx = database.pool().begin().await.expect("begin");
    let written = apply::<P::Dialect, Record, _>(&mut tx, write, &ModelBatch::local(models)).await;
    if written.is_ok() {
        tx.commit().await.expect("commit");
    }
    written
}

/// `keys` of `M`'s table read at once, as the relay's drains read their rows together
/// ([`Store::load_models`](outbox_core::store::Store::load_models)): each row as the model, in the
/// keys' order, `None` where no row has the key.
async fn read_together<P: Provision, M: ReplicatedModel + Payload>(
    database: &SqlxTestDatabase<P>,
    keys: &[outbox_core::Id],
) -> Vec<Option<M>> {
    SqlxStore::<P::Dialect>::new(database.pool().clone())
        .load_models(&M::TABLE, keys)
        .await
        .expect("read the rows together")
        .into_iter()
        .map(|row| row.map(|row| row.deserialize::<M>().expect("the row reads as its model")))
        .collect()
}

/// Every field is stored as its value and read back at delivery as it was: through insert,
/// update and save, with NULLs and without.
async fn typed_columns_round_trip<P: Provision>(ddl: &str)
where
    Record: Writable<P::Dialect>,
    <P::Dialect as Dialect>::Database: Decodes<Vec<u8>>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database.execute(ddl).await;
    let seen = Seen::default();
    let relay = database.relay(registry(&seen));

    let plain = record(1);
    let full = Record {
        note: Some("it's ☃".into()),
        maybe: Some(Vec::new()),
        amount: -0.25,
        ..record(2)
    };
    write(&database, Write::Insert, &[plain.clone(), full.clone()])
        .await
        .expect("insert");
    // The bytes are the bytes: five of them, not the text `[1,2,3,0,255]`.
    let row = sqlx::query("SELECT data FROM records WHERE id = 1")
        .fetch_one(<P::Dialect as Dialect>::Database::on(
            &mut database.pool().acquire().await.expect("a connection"),
        ))
        .await
        .expect("the row");
    let data: Vec<u8> = get::<<P::Dialect as Dialect>::Database, _>(&row, 0).expect("bytes");
    assert_eq!(data, plain.data);
    // Read together, each row is read as it is read alone: in the keys' order, once per key.
    assert_eq!(
        read_together::<P, Record>(&database, &[2.into(), 5.into(), 1.into(), 2.into()]).await,
        [
            Some(full.clone()),
            None,
            Some(plain.clone()),
            Some(full.clone())
        ]
    );
    relay.drain().await.expect("drain");
    let mut delivered = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    delivered.sort_by_key(|record| record.id);
    assert_eq!(delivered, [plain.clone(), full.clone()]);

    let updated = Record {
        data: vec![9; 300],
        note: Some("updated".into()),
        flag: !plain.flag,
        ..plain.clone()
    };
    let saved = Record {
        note: None,
        maybe: None,
        doc: serde_json::json!([1, null]),
        ..full.clone()
    };
    let new = Record {
        maybe: Some(vec![7]),
        ..record(3)
    };
    let rows = write(&database, Write::Update, std::slice::from_ref(&updated))
        .await
        .expect("update");
    assert_eq!(rows.rows, 1);
    write(&database, Write::Save, &[saved.clone(), new.clone()])
        .await
        .expect("save");
    relay.drain().await.expect("drain");
    let mut delivered = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    delivered.sort_by_key(|record| record.id);
    assert_eq!(delivered, [updated, saved, new]);
}

#[tokio::test]
async fn postgres_typed_columns_round_trip() {
    typed_columns_round_trip::<PgDatabase>(PG_RECORDS).await;
}

#[tokio::test]
async fn sqlite_typed_columns_round_trip() {
    typed_columns_round_trip::<SqliteFile>(SQLITE_RECORDS).await;
}

/// A model whose `count` the table holds as text: written, it would read back as a string.
#[replicated_model(scope = Org, id = 2, table = "counters", shard = org)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Counter {
    id: i64,
    org: i64,
    count: i64,
}

/// A model with a field its table lacks.
#[replicated_model(scope = Org, id = 3, table = "gauges", shard = org)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Gauge {
    id: i64,
    org: i64,
    level: i32,
}

/// A model whose table does not exist.
#[replicated_model(scope = Org, id = 4, table = "nowhere", shard = org)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Lost {
    id: i64,
    org: i64,
}

async fn outboxes<P: Provision>(database: &SqlxTestDatabase<P>) -> i64 {
    let row = sqlx::query("SELECT count(*) FROM outbox_messages")
        .fetch_one(<P::Dialect as Dialect>::Database::on(
            &mut database.pool().acquire().await.expect("a connection"),
        ))
        .await
        .expect("count");
    get::<<P::Dialect as Dialect>::Database, _>(&row, 0).expect("a count")
}

/// Before a model's first write, its fields are compared with its table's columns: a type the
/// column does not hold as it is, a missing column, a missing table are each a typed error
/// naming what differs, and nothing is written.
async fn a_model_that_does_not_match_its_table_is_refused<P: Provision>()
where
    Counter: Writable<P::Dialect>,
    Gauge: Writable<P::Dialect>,
    Lost: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database
        .execute("CREATE TABLE counters (id BIGINT PRIMARY KEY, org BIGINT NOT NULL, count TEXT)")
        .await;
    database
        .execute("CREATE TABLE gauges (id BIGINT PRIMARY KEY, org BIGINT NOT NULL)")
        .await;
    let database = &database;

    let counter = Counter {
        id: 1,
        org: 1,
        count: 42,
    };
    let error = write_one::<P, _>(database, &counter).await;
    let Error::ModelMismatch {
        model: "counter",
        table: "counters",
        mismatch:
            ColumnMismatch::IncompatibleType {
                field: "count",
                column: "count",
                field_type: "i64",
                column_type,
            },
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(column_type, "TEXT");
    assert!(
        error.to_string().contains(
            "field `count` is a `i64`, which column `count` of type `TEXT` does not hold"
        ),
        "{error}"
    );
    let checked = check_pooled::<P::Dialect, Counter>(database.pool()).await;
    assert!(
        matches!(checked, Err(Error::ModelMismatch { .. })),
        "{checked:?}"
    );

    let error = write_one::<P, _>(
        database,
        &Gauge {
            id: 1,
            org: 1,
            level: 3,
        },
    )
    .await;
    assert!(
        matches!(
            error,
            Error::ModelMismatch {
                mismatch: ColumnMismatch::MissingColumn {
                    field: "level",
                    column: "level"
                },
                ..
            }
        ),
        "{error:?}"
    );

    let error = write_one::<P, _>(database, &Lost { id: 1, org: 1 }).await;
    assert!(
        matches!(
            error,
            Error::ModelMismatch {
                table: "nowhere",
                mismatch: ColumnMismatch::NoTable,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(outboxes(database).await, 0, "nothing was written");

    // Fixed, the table takes the model.
    database.execute("DROP TABLE counters").await;
    database
        .execute("CREATE TABLE counters (id BIGINT PRIMARY KEY, org BIGINT NOT NULL, count BIGINT)")
        .await;
    check_pooled::<P::Dialect, Counter>(database.pool())
        .await
        .expect("the table matches now");
    let mut tx = database.pool().begin().await.expect("begin");
    apply::<P::Dialect, Counter, _>(&mut tx, Write::Save, &ModelBatch::local(&counter))
        .await
        .expect("a matching model writes");
}

async fn write_one<P: Provision, M>(database: &SqlxTestDatabase<P>, model: &M) -> Error
where
    M: Writable<P::Dialect> + outbox_core::LocalModel,
{
    let mut tx = database.pool().begin().await.expect("begin");
    match apply::<P::Dialect, M, _>(&mut tx, Write::Insert, &ModelBatch::local(model)).await {
        Ok(_) => panic!("a model that does not match its table was written"),
        Err(error) => error,
    }
}

#[tokio::test]
async fn postgres_a_model_that_does_not_match_its_table_is_refused() {
    a_model_that_does_not_match_its_table_is_refused::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_a_model_that_does_not_match_its_table_is_refused() {
    a_model_that_does_not_match_its_table_is_refused::<SqliteFile>().await;
}

/// A key newtype: its own `sqlx` type (here by hand; `#[derive(sqlx::Type)]
/// #[sqlx(transparent)]` does the same) and an `Identifier`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
struct TicketId(i64);

impl outbox_core::Identifier for TicketId {
    fn to_id(&self) -> outbox_core::Id {
        outbox_core::Id::integer(self.0)
    }

    fn from_id(id: outbox_core::Id) -> Option<Self> {
        i64::try_from(id).ok().map(Self)
    }
}

impl<DB: sqlx::Database> sqlx::Type<DB> for TicketId
where
    i64: sqlx::Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <i64 as sqlx::Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <i64 as sqlx::Type<DB>>::compatible(ty)
    }
}

impl<'q, DB: sqlx::Database> sqlx::Encode<'q, DB> for TicketId
where
    i64: sqlx::Encode<'q, DB>,
{
    fn encode_by_ref(
        &self,
        buf: &mut DB::ArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        self.0.encode_by_ref(buf)
    }
}

/// A model keyed and sharded by newtypes.
#[replicated_model(scope = Org, id = 5, table = "tickets", shard = board)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ticket {
    id: TicketId,
    board: TicketId,
    title: String,
}

/// Keys and shards of a newtype of an integer: written as their own type, delivered with the
/// model read back by its key.
async fn newtype_keys_replicate<P: Provision>()
where
    Ticket: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database
        .execute("CREATE TABLE tickets (id BIGINT PRIMARY KEY, board BIGINT NOT NULL, title TEXT NOT NULL)")
        .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let seen = Arc::clone(&seen);
        Registry::builder()
            .replication::<Ticket>(move |r: Replication<Ticket>| {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((r.shard.shard_identifier, r.object));
                async { Ok::<_, outbox_core::BoxError>(()) }
            })
            .deletion::<Ticket>(|_: Deletion<Ticket>| async { Ok::<_, outbox_core::BoxError>(()) })
            .build()
            .expect("a registry")
    };
    let ticket = Ticket {
        id: TicketId(41),
        board: TicketId(9),
        title: "flaky test".into(),
    };
    let mut tx = database.pool().begin().await.expect("begin");
    apply::<P::Dialect, Ticket, _>(&mut tx, Write::Save, &ModelBatch::local(&ticket))
        .await
        .expect("save");
    tx.commit().await.expect("commit");
    database.relay(registry).drain().await.expect("drain");
    assert_eq!(
        *seen.lock().unwrap_or_else(PoisonError::into_inner),
        [(outbox_core::Id::integer(9), ticket)]
    );
}

#[tokio::test]
async fn postgres_newtype_keys_replicate() {
    newtype_keys_replicate::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_newtype_keys_replicate() {
    newtype_keys_replicate::<SqliteFile>().await;
}

#[replicated_model(scope = Org, id = 7, table = "documents", shard = workspace)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Document {
    id: Uuid,
    workspace: Uuid,
    title: String,
}

/// UUID keys and shards (identifiers wider than an `i64`): written as UUIDs, delivered with
/// the row read back by its UUID key, deleted by it, and handed to the deletion handler as
/// the same identifier. A UUID whose value is small is still a UUID, not an integer.
async fn uuid_keys_replicate<P: Provision>()
where
    Document: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    let uuid = if P::Dialect::NAME == "PostgreSQL" {
        "UUID"
    } else {
        "BLOB"
    };
    database
        .execute(&format!(
            "CREATE TABLE documents (id {uuid} PRIMARY KEY, workspace {uuid} NOT NULL, \
             title TEXT NOT NULL)"
        ))
        .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let (replicated, deleted) = (Arc::clone(&seen), Arc::clone(&seen));
        Registry::builder()
            .replication::<Document>(move |r: Replication<Document>| {
                replicated
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((r.shard.shard_identifier, r.object.id, r.object.title));
                async { Ok::<_, outbox_core::BoxError>(()) }
            })
            .deletion::<Document>(move |d: Deletion<Document>| {
                let id: Uuid = d.key().expect("the key, a UUID");
                deleted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((d.shard.shard_identifier, id, "gone".to_owned()));
                async { Ok::<_, outbox_core::BoxError>(()) }
            })
            .build()
            .expect("a registry")
    };
    let workspace = Uuid::from_u128(0x6f1c_2a7e_93b4_4c1d_8e2f_0a1b_2c3d_4e5f);
    let documents = [
        Document {
            id: Uuid::from_u128(1),
            workspace,
            title: "small".into(),
        },
        Document {
            id: Uuid::from_u128(u128::MAX - 7),
            workspace,
            title: "large".into(),
        },
    ];
    let mut tx = database.pool().begin().await.expect("begin");
    apply::<P::Dialect, Document, _>(&mut tx, Write::Save, &ModelBatch::local(&documents))
        .await
        .expect("save");
    tx.commit().await.expect("commit");
    let missing = Uuid::from_u128(2);
    assert_eq!(
        read_together::<P, Document>(
            &database,
            &[
                documents[1].id.into(),
                missing.into(),
                documents[0].id.into()
            ]
        )
        .await,
        [Some(documents[1].clone()), None, Some(documents[0].clone())],
        "rows read together by their UUID keys"
    );
    database
        .relay(registry.clone())
        .drain()
        .await
        .expect("drain");
    let shard = outbox_core::Id::from(workspace);
    assert_eq!(
        std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner)),
        [
            (shard, documents[0].id, "small".to_owned()),
            (shard, documents[1].id, "large".to_owned()),
        ]
    );

    let mut tx = database.pool().begin().await.expect("begin");
    let deleted = apply::<P::Dialect, Document, _>(
        &mut tx,
        Write::Delete,
        &ModelBatch::local(&documents[..1]),
    )
    .await
    .expect("delete");
    tx.commit().await.expect("commit");
    assert_eq!(deleted.rows, 1, "the row found by its UUID");
    database.relay(registry).drain().await.expect("drain");
    assert_eq!(
        *seen.lock().unwrap_or_else(PoisonError::into_inner),
        [(shard, documents[0].id, "gone".to_owned())]
    );
}

#[tokio::test]
async fn postgres_uuid_keys_replicate() {
    uuid_keys_replicate::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_uuid_keys_replicate() {
    uuid_keys_replicate::<SqliteFile>().await;
}

/// A model whose serde form renames a field: its columns match its fields, but its row would
/// not read back under the serde name.
#[replicated_model(scope = Org, id = 6, table = "labels", shard = org)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Label {
    id: i64,
    org: i64,
    #[serde(rename = "title")]
    name: String,
}

/// A model checked against its table (`check_model`) still has its serde form checked at its
/// first write: the table check needs no model, the shape check does.
async fn a_checked_model_still_has_its_shape_checked<P: Provision>()
where
    Label: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database
        .execute("CREATE TABLE labels (id BIGINT PRIMARY KEY, org BIGINT NOT NULL, name TEXT)")
        .await;
    check_pooled::<P::Dialect, Label>(database.pool())
        .await
        .expect("its columns match its fields");
    let label = Label {
        id: 1,
        org: 1,
        name: "x".into(),
    };
    let error = write_one::<P, _>(&database, &label).await;
    assert!(
        matches!(error, Error::ModelShape { model: "label", .. }),
        "{error:?}"
    );
    assert_eq!(outboxes(&database).await, 0, "nothing was written");
}

#[tokio::test]
async fn postgres_a_checked_model_still_has_its_shape_checked() {
    a_checked_model_still_has_its_shape_checked::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_a_checked_model_still_has_its_shape_checked() {
    a_checked_model_still_has_its_shape_checked::<SqliteFile>().await;
}
