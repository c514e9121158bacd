-- The inbox (S10b): the messages each consumer has applied, recorded by `Inbox::receive` in
-- the transaction that applies them, so that the effect and its record commit together.
-- `Inbox::purge_older_than` deletes a consumer's records older than its window, by the index
-- on (consumer, received_at). A new table: a binary that predates it never reads it.
CREATE TABLE outbox_inbox (
    consumer     TEXT    NOT NULL CHECK (typeof(consumer) = 'text' AND consumer <> ''),
    message_id   INTEGER NOT NULL CHECK (typeof(message_id) = 'integer'),
    received_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
        CHECK (typeof(received_at) = 'integer'),
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX outbox_inbox_received ON outbox_inbox (consumer, received_at);

-- A consumer's dead letters: messages its handler failed on too many times, or that could
-- not be decoded (no message id, a category it has no handler for, a payload that does not
-- read). Recorded with the message's inbox record, in one transaction, before the broker is
-- acknowledged; listed by consumer, oldest first.
CREATE TABLE outbox_inbox_dead_letters (
    id          INTEGER PRIMARY KEY,
    consumer    TEXT    NOT NULL CHECK (typeof(consumer) = 'text' AND consumer <> ''),
    message_id  INTEGER CHECK (message_id IS NULL OR typeof(message_id) = 'integer'),
    category    TEXT,
    headers     TEXT    NOT NULL CHECK (json_valid(headers)),
    payload     BLOB    NOT NULL,
    error       TEXT    NOT NULL,
    attempts    INTEGER NOT NULL CHECK (typeof(attempts) = 'integer'),
    failed_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
        CHECK (typeof(failed_at) = 'integer')
);

CREATE INDEX outbox_inbox_dead_letters_consumer ON outbox_inbox_dead_letters (consumer, id);
