-- Pending outbox messages. AUTOINCREMENT keeps ids increasing even after the newest row is
-- deleted: ids order a shard, and a shard's failure watermark compares against them.
CREATE TABLE outbox_messages (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_scope       INTEGER NOT NULL,
    shard_identifier  INTEGER NOT NULL,
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       TEXT    NOT NULL DEFAULT '',
    category          INTEGER NOT NULL,
    object_identifier INTEGER NOT NULL,
    payload           TEXT    NOT NULL CHECK (json_valid(payload)),
    created_at        INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);

-- A shard's oldest rows (the relay's head read), and the skip-scan that discovers shards with
-- pending rows one index seek per shard.
CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, destination, id);

-- A group's newest row beyond the head read, and acknowledging (deleting) a group.
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, destination, category, object_identifier, id);

-- Relay state of the shards it has worked on: lease, backoff, parking. Writers never touch
-- it, so writing an outbox takes no lock beyond the insert. Times are Unix milliseconds.
CREATE TABLE outbox_shards (
    shard_scope      INTEGER NOT NULL,
    shard_identifier INTEGER NOT NULL,
    destination      TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    retry_at         INTEGER,
    -- Highest message id seen when the shard last failed: a newer message makes it due.
    watermark        INTEGER NOT NULL DEFAULT 0,
    parked_category  INTEGER,
    lease_owner      TEXT,
    lease_token      INTEGER,
    lease_expires_at INTEGER,
    PRIMARY KEY (shard_scope, shard_identifier, destination)
) WITHOUT ROWID;

-- Fencing tokens: one counter for all claims, so a token is never issued twice.
CREATE TABLE outbox_sequences (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO outbox_sequences (name, value) VALUES ('lease_token', 0);
