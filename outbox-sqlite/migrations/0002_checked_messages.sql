-- SQLite stores any value in any column: a row written by hand with a scope outside SMALLINT's
-- range, a text shard identifier or a payload that is not JSON text could never be delivered.
-- The outbox table is rebuilt with CHECK constraints that refuse such rows at write time, as
-- PostgreSQL's column types do. Rows already there that break them are set aside, whole, in
-- outbox_rejected_messages (the relay reports how many at start-up), never deleted.

CREATE TABLE outbox_messages_checked (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_scope       INTEGER NOT NULL
        CHECK (typeof(shard_scope) = 'integer' AND shard_scope BETWEEN -32768 AND 32767),
    shard_identifier  INTEGER NOT NULL CHECK (typeof(shard_identifier) = 'integer'),
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       TEXT    NOT NULL DEFAULT '' CHECK (typeof(destination) = 'text'),
    category          INTEGER NOT NULL
        CHECK (typeof(category) = 'integer' AND category BETWEEN -2147483648 AND 2147483647),
    object_identifier INTEGER NOT NULL CHECK (typeof(object_identifier) = 'integer'),
    payload           TEXT    NOT NULL CHECK (typeof(payload) = 'text' AND json_valid(payload)),
    created_at        INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
        CHECK (typeof(created_at) = 'integer')
);

INSERT INTO outbox_messages_checked
    (id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
     created_at)
SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
    created_at
FROM outbox_messages
WHERE typeof(shard_scope) = 'integer' AND shard_scope BETWEEN -32768 AND 32767
    AND typeof(shard_identifier) = 'integer'
    AND typeof(destination) = 'text'
    AND typeof(category) = 'integer' AND category BETWEEN -2147483648 AND 2147483647
    AND typeof(object_identifier) = 'integer'
    AND typeof(payload) = 'text' AND json_valid(payload)
    AND typeof(created_at) = 'integer';

-- Untyped columns: what was stored is kept as it was.
CREATE TABLE outbox_rejected_messages (
    id                INTEGER PRIMARY KEY,
    shard_scope,
    shard_identifier,
    destination,
    category,
    object_identifier,
    payload,
    created_at,
    rejected_at       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    reason            TEXT    NOT NULL
);

INSERT INTO outbox_rejected_messages
    (id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
     created_at, reason)
SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
    created_at,
    'no relay can deliver it: ' || CASE
        WHEN NOT (typeof(shard_scope) = 'integer' AND shard_scope BETWEEN -32768 AND 32767)
            THEN 'shard_scope is not a SMALLINT'
        WHEN typeof(shard_identifier) <> 'integer' THEN 'shard_identifier is not an integer'
        WHEN typeof(destination) <> 'text' THEN 'destination is not text'
        WHEN NOT (typeof(category) = 'integer' AND category BETWEEN -2147483648 AND 2147483647)
            THEN 'category is not an INTEGER'
        WHEN typeof(object_identifier) <> 'integer' THEN 'object_identifier is not an integer'
        WHEN NOT (typeof(payload) = 'text' AND json_valid(payload)) THEN 'payload is not JSON text'
        ELSE 'created_at is not an integer'
    END
FROM outbox_messages
WHERE id NOT IN (SELECT id FROM outbox_messages_checked);

-- Ids keep increasing past every id ever issued, deleted ones included.
DELETE FROM sqlite_sequence WHERE name = 'outbox_messages_checked';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_messages_checked', max(seq) FROM sqlite_sequence WHERE name = 'outbox_messages'
HAVING max(seq) IS NOT NULL;

DROP TABLE outbox_messages;
ALTER TABLE outbox_messages_checked RENAME TO outbox_messages;

CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, destination, id);
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, destination, category, object_identifier, id);
