-- Backfills (S11): one watermark per replicated model. Relays record the model and the
-- replication version their code declares; an operator raises target_version to start a walk
-- (`outbox backfill start`); a relay walks a batch while it holds the row (FOR UPDATE SKIP
-- LOCKED: another relay skips the model meanwhile) and moves low_bound in the transaction that
-- writes the batch's outboxes. low_bound is the last key walked, as the outbox writes
-- identifiers (a decimal integer, or a UUID's text); destinations a JSON array of names.
CREATE TABLE outbox_backfills (
    category         INTEGER     PRIMARY KEY,
    model            TEXT        NOT NULL DEFAULT '',
    declared_version INTEGER     NOT NULL DEFAULT 0,
    target_version   INTEGER     NOT NULL DEFAULT 0,
    walking_version  INTEGER     NOT NULL DEFAULT 0,
    done_version     INTEGER     NOT NULL DEFAULT 0,
    low_bound        TEXT,
    rows_walked      BIGINT      NOT NULL DEFAULT 0,
    destinations     TEXT,
    worker           TEXT,
    started_at       TIMESTAMPTZ,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    last_error       TEXT
);
