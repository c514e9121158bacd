-- Fencing tokens: one sequence for all claims, so a token is never issued twice and every new
-- claim of a shard carries a greater token than the one before.
CREATE SEQUENCE outbox_lease_tokens;

-- Pending outbox messages.
CREATE TABLE outbox_messages (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard_scope       SMALLINT    NOT NULL,
    shard_identifier  BIGINT      NOT NULL,
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       TEXT        NOT NULL DEFAULT '',
    category          INTEGER     NOT NULL,
    object_identifier BIGINT      NOT NULL,
    payload           JSONB       NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A shard's oldest rows (the relay's head read), and the skip-scan that discovers shards with
-- pending rows one index descent per shard.
CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, destination, id);

-- A group's newest row beyond the head read, and acknowledging (deleting) a group.
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, destination, category, object_identifier, id);

-- Relay state of the shards it has worked on: lease, backoff, parking. Writers never touch
-- it, so writing an outbox takes no lock beyond the insert.
CREATE TABLE outbox_shards (
    shard_scope      SMALLINT    NOT NULL,
    shard_identifier BIGINT      NOT NULL,
    destination      TEXT        NOT NULL,
    attempts         INTEGER     NOT NULL DEFAULT 0,
    last_error       TEXT,
    retry_at         TIMESTAMPTZ,
    -- Highest message id seen when the shard last failed: a newer message makes it due.
    watermark        BIGINT      NOT NULL DEFAULT 0,
    parked_category  INTEGER,
    lease_owner      TEXT,
    lease_token      BIGINT,
    lease_expires_at TIMESTAMPTZ,
    PRIMARY KEY (shard_scope, shard_identifier, destination)
);

-- Wake the relays on commit. One notification per statement, naming up to 20 shards ('*' for
-- more); NOTIFY delivers at commit and drops it on rollback.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    shard_count integer;
    shards      text;
BEGIN
    SELECT count(*), string_agg(shard, E'\n')
      INTO shard_count, shards
      FROM (SELECT DISTINCT shard_scope || ':' || shard_identifier || ':' || destination AS shard
              FROM new_rows LIMIT 21) AS distinct_shards;
    IF shard_count > 20 OR shards IS NULL THEN
        shards := '*';
    END IF;
    PERFORM pg_notify('outbox_messages', shards);
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_messages_notify
    AFTER INSERT ON outbox_messages
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
