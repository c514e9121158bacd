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
