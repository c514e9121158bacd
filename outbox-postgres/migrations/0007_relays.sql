-- Relays' heartbeats: a running relay writes its row (by worker id) every heartbeat interval
-- and at once when its shards start or stop waiting on a breaker, and deletes it when it
-- stops. A row past expires_at is a relay that stopped answering (killed, hung, cut off);
-- another relay's heartbeat deletes it a day later. `outbox status` reads them: which relays
-- run, and which systems (breakers, by name, a JSON array) they are waiting on.
CREATE TABLE outbox_relays (
    worker         TEXT        PRIMARY KEY,
    started_at     TIMESTAMPTZ NOT NULL,
    seen_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at     TIMESTAMPTZ NOT NULL,
    in_flight      BIGINT      NOT NULL DEFAULT 0,
    waiting        BIGINT      NOT NULL DEFAULT 0,
    open_breakers  TEXT        NOT NULL DEFAULT '[]'
);
