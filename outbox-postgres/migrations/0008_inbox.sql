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

-- A consumer's dead letters: messages its handler failed on too many times, or that could
-- not be decoded (no message id, a category it has no handler for, a payload that does not
-- read). Recorded with the message's inbox record, in one transaction, before the broker is
-- acknowledged; listed by consumer, oldest first.
CREATE TABLE outbox_inbox_dead_letters (
    id          BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    TEXT        NOT NULL,
    message_id  BIGINT,
    category    TEXT,
    headers     JSONB       NOT NULL,
    payload     BYTEA       NOT NULL,
    error       TEXT        NOT NULL,
    attempts    INTEGER     NOT NULL,
    failed_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX outbox_inbox_dead_letters_consumer ON outbox_inbox_dead_letters (consumer, id);
