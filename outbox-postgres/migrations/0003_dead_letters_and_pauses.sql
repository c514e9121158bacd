-- Dead letters (S22): the rows of a group that failed its category's max_attempts, moved here
-- in the transaction that deletes them from outbox_messages, with what the relay knew of the
-- failure. A dead letter keeps its message id (ids are never reused); replaying it writes it
-- back to outbox_messages as a new message.
CREATE TABLE outbox_dead_letters (
    message_id        BIGINT      PRIMARY KEY,
    shard_scope       SMALLINT    NOT NULL,
    shard_identifier  BIGINT      NOT NULL,
    destination       TEXT        NOT NULL,
    category          INTEGER     NOT NULL,
    object_identifier BIGINT      NOT NULL,
    object_wide       BYTEA       NOT NULL DEFAULT '',
    payload           JSONB       NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL,
    error             TEXT        NOT NULL,
    attempts          INTEGER     NOT NULL,
    first_failed_at   TIMESTAMPTZ NOT NULL,
    dead_lettered_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_token       BIGINT      NOT NULL
);

-- Retention purges the oldest first.
CREATE INDEX outbox_dead_letters_age ON outbox_dead_letters (dead_lettered_at);

-- When the failures at a shard's head began: what a dead letter records as its first failure.
ALTER TABLE outbox_shards ADD COLUMN first_failed_at TIMESTAMPTZ;

-- Pauses (S23): a shard, a scope's shards, or the shards holding a category's messages. The
-- columns a kind does not use hold their defaults. Relays read this table at every discovery
-- and claim; it is empty, and costs nothing, when nothing is paused.
CREATE TABLE outbox_pauses (
    kind             TEXT        NOT NULL CHECK (kind IN ('shard', 'scope', 'category')),
    shard_scope      SMALLINT    NOT NULL DEFAULT 0,
    shard_identifier BIGINT      NOT NULL DEFAULT 0,
    destination      TEXT        NOT NULL DEFAULT '',
    category         INTEGER     NOT NULL DEFAULT 0,
    reason           TEXT,
    paused_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, shard_scope, shard_identifier, destination, category)
);
