-- Relays' heartbeats: a running relay writes its row (by worker id) every heartbeat interval
-- and at once when its shards start or stop waiting on a breaker, and deletes it when it
-- stops. A row past expires_at is a relay that stopped answering (killed, hung, cut off);
-- another relay's heartbeat deletes it a day later. `outbox status` reads them: which relays
-- run, and which systems (breakers, by name, a JSON array) they are waiting on. Times are
-- Unix milliseconds.
CREATE TABLE outbox_relays (
    worker         TEXT    PRIMARY KEY,
    started_at     INTEGER NOT NULL,
    seen_at        INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    expires_at     INTEGER NOT NULL,
    in_flight      INTEGER NOT NULL DEFAULT 0,
    waiting        INTEGER NOT NULL DEFAULT 0,
    open_breakers  TEXT    NOT NULL DEFAULT '[]'
);
