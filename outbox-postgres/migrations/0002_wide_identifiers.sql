-- Identifiers wider than BIGINT (a u64 above i64::MAX, a u128, a UUID) as shard and object
-- identifiers. Each identifier column gets a BYTEA beside it: empty for an integer identifier
-- (the BIGINT holds it, as before), the 16 big-endian bytes of a wide one (whose BIGINT holds
-- i64::MAX, so that the two columns order identifiers integers first). A constant default
-- rewrites no row; the indexes and the shard table's key are rebuilt to include the new
-- columns.
--
-- A binary that predates this migration keeps working beside it (its rows get the defaults),
-- but reads a wide shard as the integer i64::MAX: write wide identifiers only once every
-- binary that runs a relay on this database applies this migration.
ALTER TABLE outbox_messages
    ADD COLUMN shard_wide  BYTEA NOT NULL DEFAULT ''
        CONSTRAINT outbox_messages_shard_wide CHECK (length(shard_wide) IN (0, 16)),
    ADD COLUMN object_wide BYTEA NOT NULL DEFAULT ''
        CONSTRAINT outbox_messages_object_wide CHECK (length(object_wide) IN (0, 16));

DROP INDEX outbox_messages_shard;
CREATE INDEX outbox_messages_shard ON outbox_messages
    (shard_scope, shard_identifier, shard_wide, destination, id);

DROP INDEX outbox_messages_group;
CREATE INDEX outbox_messages_group ON outbox_messages
    (shard_scope, shard_identifier, shard_wide, destination, category, object_identifier,
     object_wide, id);

ALTER TABLE outbox_shards
    ADD COLUMN shard_wide BYTEA NOT NULL DEFAULT ''
        CONSTRAINT outbox_shards_shard_wide CHECK (length(shard_wide) IN (0, 16)),
    DROP CONSTRAINT outbox_shards_pkey,
    ADD PRIMARY KEY (shard_scope, shard_identifier, shard_wide, destination);

-- The wake-up names a wide shard as 'x' and its hex digits: a relay that predates this
-- migration reads that as "any shard" and looks.
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
