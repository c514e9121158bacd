//! The pieces MariaDB's statements are made of.
//!
//! MariaDB takes positional `?` parameters only, and the shared body binds each statement's
//! parameters once, in the order `outbox_sqlx::Statements` numbers them. A statement that needs
//! a parameter twice, or out of order, takes them all at its start, once and in order, in a
//! one-row table `p` (a derived table, or a CTE), and names them there.
//!
//! Two things MariaDB 10.11's optimizer does shape the statements:
//!
//! - A table of parameters joined into a query block that orders or limits by an index
//!   (`FROM (SELECT ? AS scope, …) p JOIN outbox_messages m … ORDER BY m.id LIMIT n`) makes
//!   MariaDB read the whole shard and sort it. Where an index order, a range or a loose index
//!   scan matters, a parameter is read as a scalar subquery of the CTE `p` ([`param!`]), which
//!   MariaDB evaluates while optimizing, as a constant.
//! - A correlated subquery never seeks a range of an index (`x.id > outer.id` filters a scan
//!   from the start of the index or of its `ref` prefix): there is no `LATERAL`. Correlated
//!   subqueries seek by equality only, then by index order with `LIMIT` ([`newest_of!`]).
//!   Where such a subquery finds a shard's first or last message ([`newest_of!`], the
//!   console's listings) it names the shard index (`FORCE INDEX (outbox_messages_shard)`):
//!   from the sampled statistics of a table of shallow shards MariaDB picked the group index,
//!   whose prefix is the same, in two of three `ANALYZE`s, and sorted the whole shard (seen in
//!   the console's sampled listing: every message of each candidate read).

/// The database's clock, in milliseconds since the Unix epoch: how the tables store time
/// (the same expression as the columns' defaults).
macro_rules! now {
    () => {
        "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)"
    };
}

/// Parameter `$name` of the CTE `p` as a scalar subquery: a constant to MariaDB's optimizer
/// (see the module's documentation).
macro_rules! param {
    ($name:literal) => {
        concat!("(SELECT p.", $name, " FROM p)")
    };
}

/// The conditions that rows `$a` and `$b` belong to the same shard.
macro_rules! same_shard {
    ($a:literal, $b:literal) => {
        concat!(
            $a,
            ".shard_scope = ",
            $b,
            ".shard_scope AND ",
            $a,
            ".shard_identifier = ",
            $b,
            ".shard_identifier AND ",
            $a,
            ".destination = ",
            $b,
            ".destination"
        )
    };
}

/// The newest message id of the shard of row `$s` (NULL if it has none): one index entry,
/// read backwards on the shard index. It stands for PostgreSQL's `EXISTS (... m.id >
/// s.watermark)`, which a correlated subquery on MariaDB would answer by reading the shard's
/// rows up to the watermark.
macro_rules! newest_of {
    ($s:literal) => {
        concat!(
            "(SELECT nw.id FROM outbox_messages nw FORCE INDEX (outbox_messages_shard) WHERE ",
            same_shard!("nw", $s),
            " ORDER BY nw.id DESC LIMIT 1)"
        )
    };
}

/// A list parameter (a JSON array of integers, as `bind_ids` binds it) as a table `j` of `id`.
macro_rules! json_ids {
    ($list:literal) => {
        concat!(
            "JSON_TABLE(",
            $list,
            ", '$[*]' COLUMNS (id BIGINT PATH '$')) AS j"
        )
    };
}

/// The parameters of a statement fenced by a lease, in order, as `p`: the shard's key and the
/// token, then the names given.
macro_rules! fenced_params {
    ($($name:literal),*) => {
        concat!(
            "(SELECT ? AS scope, ? AS identifier, ? AS destination, ? AS token"
            $(, ", ? AS ", $name)*,
            ") AS p"
        )
    };
}

/// The condition that row `s` of `outbox_shards` is the shard of `p` and `p`'s lease holds it.
macro_rules! held_by_p {
    ($s:literal) => {
        concat!(
            $s,
            ".shard_scope = p.scope AND ",
            $s,
            ".shard_identifier = p.identifier AND ",
            $s,
            ".destination = p.destination AND ",
            $s,
            ".lease_token = p.token"
        )
    };
}
