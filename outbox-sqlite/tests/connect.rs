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
