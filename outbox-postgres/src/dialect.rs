//! PostgreSQL's dialect of the shared body: its SQL, its claims (`FOR UPDATE SKIP LOCKED`), its
//! wake-ups (`LISTEN`) and its error codes.

use outbox_core::store::{ClaimOptions, EmbeddedMigration, GroupKey, HandlerMode, Lease};
use outbox_core::{Error, Id, Message, ModelRow, ModelTable, ShardKey};
use outbox_sqlx::error::database;
use outbox_sqlx::sql::Statement;
use outbox_sqlx::{Ack, Claim, Claiming, Dialect, Fault, Statements};
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgQueryResult, PgRow};
use sqlx::{Database, PgPool, Postgres, Row};

use crate::wakeups::PgWakeups;

/// PostgreSQL, for the shared body of the `sqlx` backends.
#[derive(Debug, Clone, Copy, Default)]
pub struct PgDialect;

/// The embedded migrations, in order.
const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "outbox tables",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "identifiers wider than BIGINT",
        sql: include_str!("../migrations/0002_wide_identifiers.sql"),
    },
];

const INSERT_MESSAGE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, shard_wide, destination, category, object_identifier, \
         object_wide, payload) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb) \
    RETURNING id";

// One statement for any number of messages: the columns travel as arrays.
const INSERT_MESSAGES: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, shard_wide, destination, category, object_identifier, \
         object_wide, payload) \
    SELECT scope, shard, shard_wide, destination, category, object, object_wide, payload::jsonb \
    FROM unnest($1::smallint[], $2::bigint[], $3::bytea[], $4::text[], $5::integer[], \
        $6::bigint[], $7::bytea[], $8::text[]) \
        AS rows(scope, shard, shard_wide, destination, category, object, object_wide, payload) \
    RETURNING id";

pub(crate) const FETCH: &str = "\
    SELECT id, category, shard_scope, object_identifier, object_wide, payload::text \
    FROM outbox_messages \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 AND destination = $4 \
    ORDER BY id LIMIT $5";

// Each group's rows in `$8 < id <= $9` as one statement sees them (one snapshot): their ids,
// and the newest one whole.
pub(crate) const FETCH_NEWEST: &str = "\
    SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.object_wide, m.payload::text, \
        t.ids \
    FROM unnest($5::integer[], $6::bigint[], $7::bytea[]) \
        AS g(category, object_identifier, object_wide) \
    CROSS JOIN LATERAL ( \
        SELECT array_agg(x.id) AS ids, max(x.id) AS newest FROM outbox_messages x \
        WHERE x.shard_scope = $1 AND x.shard_identifier = $2 AND x.shard_wide = $3 \
            AND x.destination = $4 \
            AND x.category = g.category AND x.object_identifier = g.object_identifier \
            AND x.object_wide = g.object_wide AND x.id > $8 AND x.id <= $9) t \
    JOIN outbox_messages m ON m.id = t.newest";

// The lease update proves (and extends) the lease: if another worker holds the row, it waits
// for it and then finds the token changed, and nothing is deleted. The head it moved past takes
// its attempts with it. Exactly the rows the relay
// read and delivered go, by id: a range of ids could hold a row that committed after the read.
pub(crate) const ACK: &str = "\
    WITH lease AS ( \
        UPDATE outbox_shards SET lease_expires_at = now() + $6::bigint * interval '1 millisecond', \
            attempts = 0 \
        WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
            AND destination = $4 AND lease_token = $5 \
        RETURNING 1), \
     acked AS ( \
        DELETE FROM outbox_messages m \
        WHERE EXISTS (SELECT 1 FROM lease) \
            AND m.shard_scope = $1 AND m.shard_identifier = $2 AND m.shard_wide = $3 \
                AND m.destination = $4 \
            AND m.id BETWEEN $7 AND $8 AND m.id = ANY($9::bigint[]) \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM acked)";

// A drained shard's last acknowledgement and its release, in one statement. The shard's state
// row goes if no row is left besides those acknowledged (a row written meanwhile keeps it, and
// it is released, still due).
pub(crate) const ACK_AND_RELEASE: &str = "\
    WITH held AS ( \
        SELECT 1 FROM outbox_shards \
        WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
            AND destination = $4 AND lease_token = $5 \
        FOR UPDATE), \
     acked AS ( \
        DELETE FROM outbox_messages m \
        WHERE EXISTS (SELECT 1 FROM held) \
            AND m.shard_scope = $1 AND m.shard_identifier = $2 AND m.shard_wide = $3 \
                AND m.destination = $4 \
            AND m.id BETWEEN $6 AND $7 AND m.id = ANY($8::bigint[]) \
        RETURNING m.id), \
     gone AS ( \
        DELETE FROM outbox_shards \
        WHERE EXISTS (SELECT 1 FROM held) \
            AND shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
                AND destination = $4 \
            AND lease_token = $5 \
            AND NOT EXISTS (SELECT 1 FROM outbox_messages x \
                WHERE x.shard_scope = $1 AND x.shard_identifier = $2 AND x.shard_wide = $3 \
                    AND x.destination = $4 \
                    AND x.id NOT IN (SELECT id FROM acked)) \
        RETURNING 1), \
     released AS ( \
        UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
            last_error = NULL, retry_at = NULL, parked_category = NULL \
        WHERE EXISTS (SELECT 1 FROM held) AND NOT EXISTS (SELECT 1 FROM gone) \
            AND shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
                AND destination = $4 \
            AND lease_token = $5 \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM acked), \
        (SELECT count(*) FROM gone) + (SELECT count(*) FROM released)";

// A lease extended from beside a running handler.
const EXTEND_LEASE: &str = "\
    UPDATE outbox_shards SET lease_expires_at = now() + $6::bigint * interval '1 millisecond' \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5";

pub(crate) const DELETE_IF_EMPTY: &str = "\
    DELETE FROM outbox_shards \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5 \
        AND NOT EXISTS (SELECT 1 FROM outbox_messages m \
            WHERE m.shard_scope = $1 AND m.shard_identifier = $2 AND m.shard_wide = $3 \
                AND m.destination = $4)";

const RELEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
        last_error = NULL, retry_at = NULL, parked_category = NULL \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5";

const RELEASE_LEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5";

const FAIL: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = $6, \
        last_error = $7, retry_at = now() + $8::bigint * interval '1 millisecond', \
        watermark = $9, parked_category = $10 \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5";

// Skip-scan: one index descent per shard with pending rows, never a read of every row. Each
// step finds the first row of the next shard in key order. Shards are due when nobody holds a
// live lease on them and they are not backing off, or have a message newer than their failure.
pub(crate) const DISCOVER: &str = "\
    WITH RECURSIVE keys(shard_scope, shard_identifier, shard_wide, destination, n) AS ( \
        (SELECT shard_scope, shard_identifier, shard_wide, destination, 1 FROM outbox_messages \
         WHERE (shard_scope, shard_identifier, shard_wide, destination) \
             > ($1::integer, $2::bigint, $3::bytea, $4::text) \
         ORDER BY shard_scope, shard_identifier, shard_wide, destination LIMIT 1) \
        UNION ALL \
        SELECT next.shard_scope, next.shard_identifier, next.shard_wide, next.destination, \
            k.n + 1 \
        FROM keys k CROSS JOIN LATERAL ( \
            SELECT x.shard_scope, x.shard_identifier, x.shard_wide, x.destination \
            FROM outbox_messages x \
            WHERE (x.shard_scope, x.shard_identifier, x.shard_wide, x.destination) \
                > (k.shard_scope, k.shard_identifier, k.shard_wide, k.destination) \
            ORDER BY x.shard_scope, x.shard_identifier, x.shard_wide, x.destination LIMIT 1) next \
        WHERE k.n < $5 \
    ) \
    SELECT k.shard_scope, k.shard_identifier, k.shard_wide, k.destination, \
        s.shard_scope IS NULL OR ( \
            (s.lease_expires_at IS NULL OR s.lease_expires_at <= now()) \
            AND (s.retry_at IS NULL OR s.retry_at <= now() OR EXISTS ( \
                SELECT 1 FROM outbox_messages m \
                WHERE m.shard_scope = k.shard_scope \
                    AND m.shard_identifier = k.shard_identifier AND m.shard_wide = k.shard_wide \
                    AND m.destination = k.destination AND m.id > s.watermark))) AS due \
    FROM keys k LEFT JOIN outbox_shards s \
        ON s.shard_scope = k.shard_scope AND s.shard_identifier = k.shard_identifier \
            AND s.shard_wide = k.shard_wide \
        AND s.destination = k.destination \
    ORDER BY k.n";

// Takes the lease on an existing state row if the shard is due and nobody holds it; a row
// another transaction has locked is skipped, never waited for. A lease that lapsed without a
// release (its holder died mid-drain, having perhaps delivered the head) counts as an attempt
// at the head.
macro_rules! take_lease {
    () => {
        "UPDATE outbox_shards s SET lease_owner = $5, lease_token = nextval('outbox_lease_tokens'), \
            lease_expires_at = now() + $6::bigint * interval '1 millisecond', \
            attempts = s.attempts + (due.previous_owner IS NOT NULL)::integer \
         FROM (SELECT shard_scope, shard_identifier, shard_wide, destination, \
                   lease_owner AS previous_owner \
               FROM outbox_shards \
               WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
                   AND destination = $4 \
                 AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
                 AND (retry_at IS NULL OR retry_at <= now() OR EXISTS ( \
                     SELECT 1 FROM outbox_messages m \
                     WHERE m.shard_scope = $1 AND m.shard_identifier = $2 AND m.shard_wide = $3 \
                         AND m.destination = $4 AND m.id > outbox_shards.watermark)) \
               FOR UPDATE SKIP LOCKED) due \
         WHERE s.shard_scope = due.shard_scope \
             AND s.shard_identifier = due.shard_identifier AND s.shard_wide = due.shard_wide \
            AND s.destination = due.destination \
         RETURNING s.lease_token, s.attempts, due.previous_owner"
    };
}

// Leased mode: one statement creates the state row with the lease if the shard has none, or
// takes the lease on the existing row.
pub(crate) const CLAIM: &str = concat!(
    "WITH fresh AS ( \
        INSERT INTO outbox_shards (shard_scope, shard_identifier, shard_wide, destination, \
            lease_owner, lease_token, lease_expires_at) \
        VALUES ($1, $2, $3, $4, $5, nextval('outbox_lease_tokens'), \
            now() + $6::bigint * interval '1 millisecond') \
        ON CONFLICT DO NOTHING \
        RETURNING lease_token, attempts, NULL::text AS previous_owner), \
     taken AS (",
    take_lease!(),
    ") SELECT * FROM fresh UNION ALL SELECT * FROM taken"
);

// In-transaction mode: the state row is created (committed) first, so the long claiming
// transaction never holds an uncommitted insert that other claimers would wait on.
const ENSURE_STATE: &str = "\
    INSERT INTO outbox_shards (shard_scope, shard_identifier, shard_wide, destination) \
    VALUES ($1, $2, $3, $4) \
    ON CONFLICT DO NOTHING";

const TAKE_LEASE: &str = take_lease!();

// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
// its next claim counts as a takeover (an attempt more at the head, whose messages the
// interrupted drain may have delivered).
const RELEASE_INTERRUPTED: &str = "\
    UPDATE outbox_shards SET lease_expires_at = now() \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
        AND destination = $4 AND lease_token = $5";

const PENDING_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, shard_wide, destination, category, \
        object_identifier, object_wide, payload::text, \
        (extract(epoch FROM created_at) * 1000)::bigint \
    FROM outbox_messages ORDER BY id LIMIT $1";

const SHARD_STATES: &str = "\
    SELECT shard_scope, shard_identifier, shard_wide, destination, attempts::bigint, last_error, \
        (extract(epoch FROM retry_at) * 1000)::bigint, lease_owner, \
        (extract(epoch FROM lease_expires_at) * 1000)::bigint, lease_token, parked_category \
    FROM outbox_shards ORDER BY shard_scope, shard_identifier, shard_wide, destination";

impl Dialect for PgDialect {
    type Database = Postgres;
    type Turn = ();
    type Wakeups = PgWakeups;

    const NAME: &'static str = "PostgreSQL";
    const MIGRATIONS: &'static [EmbeddedMigration] = MIGRATIONS;
    const BEGIN: &'static str = "BEGIN";
    const WRITES_IN_TRANSACTION: bool = false;
    const MAX_PARAMETERS: usize = 65535;
    const SQL: Statements = Statements {
        insert_message: INSERT_MESSAGE,
        insert_messages: INSERT_MESSAGES,
        fetch: FETCH,
        fetch_newest: FETCH_NEWEST,
        ack: Ack::Combined(ACK),
        ack_and_release: Some(ACK_AND_RELEASE),
        extend_lease: EXTEND_LEASE,
        delete_if_empty: DELETE_IF_EMPTY,
        release: RELEASE,
        release_lease: RELEASE_LEASE,
        fail: FAIL,
        release_interrupted: RELEASE_INTERRUPTED,
        table_exists: "SELECT to_regclass($1) IS NOT NULL",
        discover: DISCOVER,
        unpark: "UPDATE outbox_shards SET retry_at = now() \
                 WHERE parked_category = ANY($1) AND retry_at > now()",
        reschedule: "UPDATE outbox_shards SET retry_at = now() \
                     WHERE shard_scope = $1 AND shard_identifier = $2 AND shard_wide = $3 \
                        AND destination = $4 AND retry_at > now()",
        pending_in_shard: "SELECT count(*) FROM outbox_messages \
                           WHERE shard_scope = $1 AND shard_identifier = $2 \
                              AND shard_wide = $3 AND destination = $4 AND id <= $5",
        pending_messages: PENDING_MESSAGES,
        shard_states: SHARD_STATES,
    };

    fn classify(error: &dyn DatabaseError) -> Fault {
        match error.code().as_deref() {
            // undefined_table, undefined_column, undefined_function
            Some("42P01" | "42703" | "42883") => Fault::SchemaMissing,
            // connection_exception (08xxx), operator_intervention (57xxx: shutdown, terminated
            // session), cannot_connect_now
            Some(code) if code.starts_with("08") || code.starts_with("57") => Fault::Unavailable,
            _ => Fault::Other,
        }
    }

    fn is_missing_table(error: &dyn DatabaseError) -> bool {
        // undefined_table
        error.code().as_deref() == Some("42P01")
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    const ID_COLUMNS: usize = 2;

    fn bind_id<'q>(query: Statement<'q, Postgres>, id: Id) -> Statement<'q, Postgres> {
        let (integer, wide) = id.to_stored();
        query.bind(integer).bind(wide)
    }

    fn decode_id(row: &PgRow, index: usize) -> Result<Id, sqlx::Error> {
        let integer: i64 = row.try_get(index)?;
        let wide: Vec<u8> = row.try_get(index + 1)?;
        Id::from_stored(integer, &wide).ok_or_else(|| {
            sqlx::Error::Decode(
                format!(
                    "({integer}, {} bytes) is not a stored identifier",
                    wide.len()
                )
                .into(),
            )
        })
    }

    fn bind_ids<'q>(query: Statement<'q, Postgres>, ids: Vec<i64>) -> Statement<'q, Postgres> {
        query.bind(ids)
    }

    fn bind_categories<'q>(
        query: Statement<'q, Postgres>,
        categories: Vec<i32>,
    ) -> Statement<'q, Postgres> {
        query.bind(categories)
    }

    fn bind_groups<'q>(
        query: Statement<'q, Postgres>,
        groups: &[GroupKey],
    ) -> Statement<'q, Postgres> {
        let categories: Vec<i32> = groups.iter().map(|group| group.category.0).collect();
        let (objects, wides): (Vec<i64>, Vec<Vec<u8>>) = groups
            .iter()
            .map(|group| group.object_identifier.to_stored())
            .unzip();
        query.bind(categories).bind(objects).bind(wides)
    }

    fn bind_messages<'q>(
        query: Statement<'q, Postgres>,
        messages: &[Message],
    ) -> Statement<'q, Postgres> {
        let mut scopes = Vec::with_capacity(messages.len());
        let mut shards = Vec::with_capacity(messages.len());
        let mut shard_wides = Vec::with_capacity(messages.len());
        let mut destinations = Vec::with_capacity(messages.len());
        let mut categories = Vec::with_capacity(messages.len());
        let mut objects = Vec::with_capacity(messages.len());
        let mut object_wides = Vec::with_capacity(messages.len());
        let mut payloads = Vec::with_capacity(messages.len());
        for message in messages {
            let shard = message.shard();
            let (shard_identifier, shard_wide) = shard.shard_identifier.to_stored();
            let (object_identifier, object_wide) = message.object_identifier().to_stored();
            scopes.push(shard.scope.0);
            shards.push(shard_identifier);
            shard_wides.push(shard_wide);
            destinations.push(shard.destination_str().to_owned());
            categories.push(message.category().0);
            objects.push(object_identifier);
            object_wides.push(object_wide);
            payloads.push(message.payload_json().to_owned());
        }
        query
            .bind(scopes)
            .bind(shards)
            .bind(shard_wides)
            .bind(destinations)
            .bind(categories)
            .bind(objects)
            .bind(object_wides)
            .bind(payloads)
    }

    fn decode_ids(row: &PgRow, index: usize) -> Result<Vec<i64>, Error> {
        row.try_get(index)
            .map_err(database::<Self>("reading a shard"))
    }

    fn load_model_sql(table: &ModelTable, wide: bool) -> String {
        crate::model::load_sql(table, wide)
    }

    fn read_model(row: &<Self::Database as Database>::Row) -> Result<ModelRow, sqlx::Error> {
        crate::model::read(row)
    }

    fn placeholder(index: usize) -> String {
        format!("${index}")
    }

    fn column_accepts(
        field: &<Self::Database as Database>::TypeInfo,
        column: &<Self::Database as Database>::TypeInfo,
        compatible: bool,
    ) -> bool {
        crate::model::accepts(field, column, compatible)
    }

    async fn take_turn(&self) {}

    async fn claim(
        &self,
        pool: &PgPool,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<Claim<Self>>, Error> {
        let operation = database::<Self>("claiming a shard");
        let lease_ms = i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX);
        let (shard_identifier, shard_wide) = shard.shard_identifier.to_stored();
        let take = |sql: &'static str| {
            sqlx::query_as::<_, (i64, i32, Option<String>)>(sql)
                .bind(shard.scope.0)
                .bind(shard_identifier)
                .bind(shard_wide.clone())
                .bind(shard.destination_str())
                .bind(&options.worker)
                .bind(lease_ms)
        };
        let (claimed, claiming) = match options.mode {
            HandlerMode::Leased => {
                let claimed = take(CLAIM).fetch_optional(pool).await.map_err(operation)?;
                (claimed, None)
            }
            HandlerMode::InTransaction => {
                outbox_sqlx::session::shard_keyed::<Self>(ENSURE_STATE, shard)
                    .execute(pool)
                    .await
                    .map_err(database::<Self>("claiming a shard"))?;
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(database::<Self>("claiming a shard"))?;
                let claimed = take(TAKE_LEASE)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(operation)?;
                (claimed, Some(Claiming { tx, turn: () }))
            }
        };
        Ok(claimed.map(|(token, attempts, previous_owner)| Claim {
            lease: Lease {
                shard: shard.clone(),
                token,
                attempts: u32::try_from(attempts).unwrap_or(0),
                previous_owner,
            },
            claiming,
        }))
    }

    async fn wakeups(pool: &PgPool) -> Result<Option<PgWakeups>, Error> {
        PgWakeups::listen(pool).await.map(Some)
    }
}

impl<'c> outbox_sqlx::model::ModelTarget<'c, 'static, PgDialect> for &'c mut sqlx::PgConnection {
    fn target(self) -> outbox_sqlx::model::Target<'c, 'static, PgDialect> {
        outbox_sqlx::model::Target::Connection(self)
    }
}
