-- Backfills (S11): one watermark per replicated model. Relays record the model and the
-- replication version their code declares; an operator raises target_version to start a walk
-- (`outbox backfill start`); a relay walks a batch in a write transaction (which SQLite
-- serialises) and moves low_bound in the transaction that writes the batch's outboxes.
-- low_bound is the last key walked, as the outbox writes identifiers (a decimal integer, or a
-- UUID's text); destinations a JSON array of names. Times are Unix milliseconds.
CREATE TABLE outbox_backfills (
    category         INTEGER PRIMARY KEY,
    model            TEXT    NOT NULL DEFAULT '',
    declared_version INTEGER NOT NULL DEFAULT 0,
    target_version   INTEGER NOT NULL DEFAULT 0,
    walking_version  INTEGER NOT NULL DEFAULT 0,
    done_version     INTEGER NOT NULL DEFAULT 0,
    low_bound        TEXT,
    rows_walked      INTEGER NOT NULL DEFAULT 0,
    destinations     TEXT,
    worker           TEXT,
    started_at       INTEGER,
    updated_at       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    completed_at     INTEGER,
    last_error       TEXT
);
