//! `connect` takes a file path or a `sqlite:` URL, and refuses any other URL by its scheme.

use outbox_core::Error;

/// A `sqlite:` URL opens (and creates) its file with the outbox's settings; a URL of another
/// scheme is refused, naming the scheme and never the password, instead of being taken for
/// a file name.
#[tokio::test]
async fn connect_takes_paths_and_sqlite_urls_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("outbox.db");
    let url = format!("sqlite://{}", file.display());
    let pool = outbox_sqlite::connect(url.as_ref())
        .await
        .expect("a sqlite: URL opens");
    outbox_sqlite::migrate(&pool).await.expect("migrate");
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .expect("read the journal mode");
    assert_eq!(journal, "wal", "the outbox's settings apply");
    pool.close().await;
    assert!(file.exists(), "the URL's file was created");

    for (url, scheme) in [
        ("postgres://app:secret@127.0.0.1:5432/postgres", "postgres"),
        ("mysql://app:secret@127.0.0.1/x", "mysql"),
    ] {
        let error = outbox_sqlite::connect(url.as_ref())
            .await
            .expect_err("another scheme is refused");
        assert!(
            matches!(error, Error::InvalidDatabaseUrl { .. }),
            "{url}: {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("`{scheme}:`")) && text.contains("`sqlite:`"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
    assert!(
        !std::path::Path::new("postgres:").exists(),
        "no file or directory was made of a URL"
    );
}

/// A reader that keeps its transaction open makes the write-ahead log grow past the limit with
/// every commit; once it ends and the log has been checkpointed, the next write cuts the
/// file back to [`outbox_sqlite::WAL_SIZE_LIMIT`] (SQLite keeps it at its largest size
/// otherwise). Stepped on two connections: the reader, then the writers' commits.
#[tokio::test]
async fn the_write_ahead_log_is_cut_back_after_a_long_reader() {
    use sqlx::Connection;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("outbox.db");
    let pool = outbox_sqlite::connect(&file).await.expect("open");
    outbox_sqlite::migrate(&pool).await.expect("migrate");
    let wal = dir.path().join("outbox.db-wal");
    let size = || std::fs::metadata(&wal).map_or(0, |metadata| metadata.len());
    let write = async |rows: i64| {
        for n in 0..rows {
            sqlx::query(
                "INSERT INTO outbox_messages \
                    (shard_scope, shard_identifier, destination, category, object_identifier, \
                     payload) \
                 VALUES (1, ?, '', 1, 1, json_object('pad', hex(randomblob(2000))))",
            )
            .bind(n)
            .execute(&pool)
            .await
            .expect("a write");
        }
        sqlx::query("DELETE FROM outbox_messages")
            .execute(&pool)
            .await
            .expect("the rows acknowledged");
    };

    let mut reader = sqlx::SqliteConnection::connect_with(&outbox_sqlite::connect_options(&file))
        .await
        .expect("the reader");
    for statement in ["BEGIN", "SELECT count(*) FROM outbox_messages"] {
        sqlx::raw_sql(statement)
            .execute(&mut reader)
            .await
            .expect(statement);
    }
    write(3_000).await;
    let held = size();
    assert!(
        held > 3 * outbox_sqlite::WAL_SIZE_LIMIT,
        "the log grows while the reader holds it: {held}"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut reader)
        .await
        .expect("the reader ends");
    drop(reader);
    // The automatic checkpoint, at the next commits, copies the log whole into the database;
    // the write after it starts the log over, and cuts the file back.
    write(10).await;
    write(10).await;
    let after = size();
    assert!(
        after <= outbox_sqlite::WAL_SIZE_LIMIT,
        "the log is cut back once checkpointed: {after} (it was {held})"
    );
}
