-- Identifiers wider than an INTEGER (a u64 above i64::MAX, a u128, a UUID) as shard and object
-- identifiers: the identifier columns hold an integer, or a wide identifier's 16 big-endian
-- bytes as a BLOB (SQLite orders every integer before every BLOB, as identifiers order). The
-- shard state table's columns take either already; the outbox table is rebuilt with CHECK
-- constraints that accept both.
--
-- A binary that predates this migration keeps working beside it, but cannot read a wide
-- identifier: write wide identifiers only once every binary that runs a relay on this
-- database applies this migration.

CREATE TABLE outbox_messages_wide (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_scope       INTEGER NOT NULL
        CHECK (typeof(shard_scope) = 'integer' AND shard_scope BETWEEN -32768 AND 32767),
    shard_identifier  INTEGER NOT NULL
        CHECK (typeof(shard_identifier) = 'integer'
            OR (typeof(shard_identifier) = 'blob' AND length(shard_identifier) = 16)),
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       TEXT    NOT NULL DEFAULT '' CHECK (typeof(destination) = 'text'),
    category          INTEGER NOT NULL
        CHECK (typeof(category) = 'integer' AND category BETWEEN -2147483648 AND 2147483647),
    object_identifier INTEGER NOT NULL
        CHECK (typeof(object_identifier) = 'integer'
            OR (typeof(object_identifier) = 'blob' AND length(object_identifier) = 16)),
    payload           TEXT    NOT NULL CHECK (typeof(payload) = 'text' AND json_valid(payload)),
    created_at        INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
        CHECK (typeof(created_at) = 'integer')
);

INSERT INTO outbox_messages_wide
    (id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
     created_at)
SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
    created_at
FROM outbox_messages;

-- Ids keep increasing past every id ever issued, deleted ones included.
DELETE FROM sqlite_sequence WHERE name = 'outbox_messages_wide';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_messages_wide', max(seq) FROM sqlite_sequence WHERE name = 'outbox_messages'
HAVING max(seq) IS NOT NULL;

DROP TABLE outbox_messages;
ALTER TABLE outbox_messages_wide RENAME TO outbox_messages;

CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, destination, id);
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, destination, category, object_identifier, id);
