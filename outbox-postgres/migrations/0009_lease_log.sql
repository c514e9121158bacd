-- The lease log (S29): shards' leases as rows that are inserted and deleted, never updated in
-- place, so that a held vacuum horizon does not make each claim walk the versions every earlier
-- drain left. A shard's lease is its newest row (found by a backward seek of the key, which
-- visits no older entry); a change deletes that row and inserts the next. The chain's first
-- row (seq 0) stays, marked superseded, until the chain ends: two claimers that both found no
-- row conflict on it in the primary key. A drain's claim inserts one row and its release
-- deletes it; while the horizon is held, a shard drained again and again keeps two rows.
-- Failures, backoff and parking stay in outbox_shards, which a shard that never fails no
-- longer touches.
CREATE TABLE outbox_leases (
    shard_scope      SMALLINT    NOT NULL,
    shard_identifier BIGINT      NOT NULL,
    destination      TEXT        NOT NULL,
    -- 0 for the chain's first row; the others' from outbox_lease_tokens: a later row of a
    -- shard has a greater one.
    seq              BIGINT      NOT NULL,
    -- The chain's first row (seq 0): at most one per shard.
    first            BOOLEAN     NOT NULL,
    -- The first row once another follows it (the others are deleted then).
    superseded       BOOLEAN     NOT NULL DEFAULT false,
    -- NULL: released.
    lease_owner      TEXT,
    lease_token      BIGINT,
    lease_expires_at TIMESTAMPTZ,
    written_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (shard_scope, shard_identifier, destination, seq)
);

-- Which lease protocol each relay speaks: a binary from before this migration leaves the
-- default, 1 (leases in outbox_shards).
ALTER TABLE outbox_relays ADD COLUMN protocol INTEGER NOT NULL DEFAULT 1;

-- The one-way switch to the lease log, made by a relay of protocol 2 once no live relay
-- speaks 1: it moves the live leases of outbox_shards into the log and clears them there.
CREATE TABLE outbox_protocol (
    only_row    BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    version     INTEGER     NOT NULL,
    switched_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- After the switch, a relay from before it can no longer take a lease in outbox_shards: its
-- claims fail with this error (and deliver nothing) instead of leasing beside the log.
CREATE FUNCTION outbox_leases_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_owner IS NOT NULL AND EXISTS (SELECT 1 FROM outbox_protocol WHERE version >= 2)
    THEN
        RAISE EXCEPTION 'outbox leases are kept in outbox_leases since the relays were upgraded: '
            'this relay predates them; run a relay of this version or later'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_shards_leases_moved
    BEFORE INSERT OR UPDATE ON outbox_shards
    FOR EACH ROW EXECUTE FUNCTION outbox_leases_moved();
