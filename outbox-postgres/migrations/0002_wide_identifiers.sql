-- Identifiers wider than BIGINT (a u64 above i64::MAX, a u128, a UUID) as shard and object
-- identifiers. Each identifier column gets a BYTEA beside it: empty for an integer identifier
-- (the BIGINT holds it, as before), the 16 big-endian bytes of a wide one (whose BIGINT holds
-- i64::MAX, so that the two columns order identifiers integers first).
--
-- The outbox table is rebuilt (its pending rows copied, their ids kept, the id sequence
-- continued) so that each new column sits where an integer row has alignment padding: an
-- integer row, and its index entries, are no larger than before. Writers wait while the
-- pending rows are copied.
--
-- A binary that predates this migration keeps working beside it (its rows get the defaults),
-- but reads a wide shard as the integer i64::MAX: write wide identifiers only once every
-- binary that runs a relay on this database applies this migration.
CREATE TABLE outbox_messages_wide (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard_scope       SMALLINT    NOT NULL,
    shard_wide        BYTEA       NOT NULL DEFAULT ''
        CONSTRAINT outbox_messages_shard_wide CHECK (length(shard_wide) IN (0, 16)),
    shard_identifier  BIGINT      NOT NULL,
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       TEXT        NOT NULL DEFAULT '',
    object_wide       BYTEA       NOT NULL DEFAULT ''
        CONSTRAINT outbox_messages_object_wide CHECK (length(object_wide) IN (0, 16)),
    category          INTEGER     NOT NULL,
    object_identifier BIGINT      NOT NULL,
    payload           JSONB       NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

LOCK TABLE outbox_messages IN EXCLUSIVE MODE;

INSERT INTO outbox_messages_wide
    (id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
     created_at)
OVERRIDING SYSTEM VALUE
SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, payload,
    created_at
FROM outbox_messages;

-- Ids keep increasing past every id ever issued, deleted ones included.
SELECT setval(pg_get_serial_sequence('outbox_messages_wide', 'id'), last_value, is_called)
FROM outbox_messages_id_seq;

DROP TABLE outbox_messages;
ALTER TABLE outbox_messages_wide RENAME TO outbox_messages;
ALTER TABLE outbox_messages RENAME CONSTRAINT outbox_messages_wide_pkey TO outbox_messages_pkey;
ALTER SEQUENCE outbox_messages_wide_id_seq RENAME TO outbox_messages_id_seq;

-- A shard's oldest rows (the relay's head read), and the skip-scan that discovers shards with
-- pending rows one index descent per shard.
CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, shard_wide, destination, id);

-- A group's newest row beyond the head read, and acknowledging (deleting) a group. Searched
-- by equality on every column but the id, so their order is free: the wide columns sit where
-- an integer row's entry has padding.
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, shard_wide, destination, object_wide, category,
     object_identifier, id);

ALTER TABLE outbox_shards
    ADD COLUMN shard_wide BYTEA NOT NULL DEFAULT ''
        CONSTRAINT outbox_shards_shard_wide CHECK (length(shard_wide) IN (0, 16)),
    DROP CONSTRAINT outbox_shards_pkey,
    ADD PRIMARY KEY (shard_scope, shard_identifier, shard_wide, destination);

-- Wake the relays on commit, naming a wide shard as 'x' and its hex digits: a relay that
-- predates this migration reads that as "any shard" and looks.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    shard_count integer;
    shards      text;
BEGIN
    SELECT count(*), string_agg(shard, E'\n')
      INTO shard_count, shards
      FROM (SELECT DISTINCT shard_scope || ':' ||
                   CASE WHEN shard_wide = '' THEN shard_identifier::text
                        ELSE 'x' || encode(shard_wide, 'hex') END
                   || ':' || destination AS shard
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
