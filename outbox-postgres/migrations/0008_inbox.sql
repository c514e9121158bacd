-- The inbox (S10b): the messages each consumer has applied, recorded by `Inbox::receive` in
-- the transaction that applies them, so that the effect and its record commit together. The
-- key makes a second record of one message wait for the first one's transaction, then find
-- it. `Inbox::purge_older_than` deletes a consumer's records older than its window, by the
-- index on (consumer, received_at). A new table: a binary that predates it never reads it.
CREATE TABLE outbox_inbox (
    consumer     TEXT        NOT NULL,
    message_id   BIGINT      NOT NULL,
    received_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX outbox_inbox_received ON outbox_inbox (consumer, received_at);
