-- The outbox tables on MariaDB (10.6 and later) and MySQL (8.0.16 and later), InnoDB.
--
-- Times are milliseconds since the Unix epoch in BIGINT columns, read from the server's clock
-- as the relay's statements read it (`outbox_now_ms`'s expression): the relay compares them
-- with the database's own clock only. Text that keys a shard compares byte for byte
-- (utf8mb4_bin), as PostgreSQL's and SQLite's do. JSON columns are text that must be valid
-- JSON: a write of malformed JSON fails at the write.
--
-- A wide identifier (a u128, a UUID) is stored as PostgreSQL's schema stores it: a shard's in
-- the destination column (behind a \u0001 marker, with BIGINT's greatest value in the
-- identifier column); an object's 16 bytes in `object_wide`, beside a BIGINT folded from them.

CREATE TABLE outbox_messages (
    id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    shard_scope       SMALLINT     NOT NULL,
    shard_identifier  BIGINT       NOT NULL,
    -- '' for a local outbox; the destination name for a fan-out outbox.
    destination       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    category          INT          NOT NULL,
    object_identifier BIGINT       NOT NULL,
    object_wide       VARBINARY(16) NOT NULL DEFAULT '',
    payload           LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    metadata          LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    created_at        BIGINT       NOT NULL
        DEFAULT (CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)),
    CONSTRAINT outbox_messages_payload_json CHECK (JSON_VALID(payload)),
    CONSTRAINT outbox_messages_metadata_json CHECK (metadata IS NULL OR JSON_VALID(metadata)),
    KEY outbox_messages_shard (shard_scope, shard_identifier, destination, id),
    KEY outbox_messages_group
        (shard_scope, shard_identifier, destination, category, object_identifier, id)
) ENGINE = InnoDB;

CREATE TABLE outbox_shards (
    shard_scope      SMALLINT     NOT NULL,
    shard_identifier BIGINT       NOT NULL,
    destination      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    attempts         INT          NOT NULL DEFAULT 0,
    last_error       TEXT,
    retry_at         BIGINT,
    -- Highest message id seen when the shard last failed: a newer message makes it due.
    watermark        BIGINT       NOT NULL DEFAULT 0,
    parked_category  INT,
    first_failed_at  BIGINT,
    lease_owner      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    lease_token      BIGINT,
    lease_expires_at BIGINT,
    PRIMARY KEY (shard_scope, shard_identifier, destination)
) ENGINE = InnoDB;

-- Fencing tokens. A sequence is not transactional: a claim takes its token without waiting
-- on any other transaction, and a token is never handed out twice, even across a restart.
CREATE SEQUENCE outbox_lease_tokens;

CREATE TABLE outbox_dead_letters (
    message_id        BIGINT       NOT NULL PRIMARY KEY,
    shard_scope       SMALLINT     NOT NULL,
    shard_identifier  BIGINT       NOT NULL,
    destination       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    category          INT          NOT NULL,
    object_identifier BIGINT       NOT NULL,
    object_wide       VARBINARY(16) NOT NULL DEFAULT '',
    payload           LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    metadata          LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    created_at        BIGINT       NOT NULL,
    error             TEXT         NOT NULL,
    attempts          INT          NOT NULL,
    first_failed_at   BIGINT       NOT NULL,
    dead_lettered_at  BIGINT       NOT NULL,
    lease_token       BIGINT       NOT NULL,
    CONSTRAINT outbox_dead_letters_payload_json CHECK (JSON_VALID(payload)),
    KEY outbox_dead_letters_age (dead_lettered_at)
) ENGINE = InnoDB;

CREATE TABLE outbox_pauses (
    kind             VARCHAR(16)  NOT NULL,
    shard_scope      SMALLINT     NOT NULL DEFAULT 0,
    shard_identifier BIGINT       NOT NULL DEFAULT 0,
    destination      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    category         INT          NOT NULL DEFAULT 0,
    reason           TEXT,
    paused_at        BIGINT       NOT NULL,
    CONSTRAINT outbox_pauses_kind CHECK (kind IN ('shard', 'scope', 'category')),
    PRIMARY KEY (kind, shard_scope, shard_identifier, destination, category)
) ENGINE = InnoDB;

CREATE TABLE outbox_backfills (
    category         INT          NOT NULL PRIMARY KEY,
    model            VARCHAR(255) NOT NULL DEFAULT '',
    declared_version INT          NOT NULL DEFAULT 0,
    target_version   INT          NOT NULL DEFAULT 0,
    walking_version  INT          NOT NULL DEFAULT 0,
    done_version     INT          NOT NULL DEFAULT 0,
    low_bound        TEXT,
    rows_walked      BIGINT       NOT NULL DEFAULT 0,
    destinations     TEXT,
    worker           VARCHAR(255),
    started_at       BIGINT,
    updated_at       BIGINT       NOT NULL
        DEFAULT (CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)),
    completed_at     BIGINT,
    last_error       TEXT
) ENGINE = InnoDB;

CREATE TABLE outbox_relays (
    worker         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    started_at     BIGINT       NOT NULL,
    seen_at        BIGINT       NOT NULL,
    expires_at     BIGINT       NOT NULL,
    in_flight      BIGINT       NOT NULL DEFAULT 0,
    waiting        BIGINT       NOT NULL DEFAULT 0,
    open_breakers  TEXT         NOT NULL
) ENGINE = InnoDB;

CREATE TABLE outbox_inbox (
    consumer     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id   BIGINT       NOT NULL,
    received_at  BIGINT       NOT NULL
        DEFAULT (CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)),
    PRIMARY KEY (consumer, message_id),
    KEY outbox_inbox_received (consumer, received_at)
) ENGINE = InnoDB;

CREATE TABLE outbox_inbox_dead_letters (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id  BIGINT,
    category    VARCHAR(255),
    headers     LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload     LONGBLOB     NOT NULL,
    error       TEXT         NOT NULL,
    attempts    INT          NOT NULL,
    failed_at   BIGINT       NOT NULL
        DEFAULT (CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)),
    CONSTRAINT outbox_inbox_dead_letters_headers_json CHECK (JSON_VALID(headers)),
    KEY outbox_inbox_dead_letters_consumer (consumer, id)
) ENGINE = InnoDB;
