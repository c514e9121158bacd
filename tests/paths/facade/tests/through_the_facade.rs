//! A test written with the facade's test kit, `#[outbox::testkit::test]`, on a SQLite file.

use outbox::sqlite::SqliteStore;
use outbox::testkit::sqlite::SqliteTestDatabase;
use outbox::{BoxError, Message, Registry, Relay};
use paths_facade::TeamRenamed;

#[outbox::testkit::test]
async fn a_message_written_through_the_facade_is_delivered(
    db: SqliteTestDatabase,
) -> Result<(), BoxError> {
    let renamed = TeamRenamed {
        name: "platform".into(),
    };
    let mut tx = db.pool().begin().await?;
    outbox::sqlite::write(&mut *tx, &Message::new::<TeamRenamed>(7, 7, &renamed)?).await?;
    tx.commit().await?;

    let relay = Relay::new(SqliteStore::new(db.pool().clone()), Registry::discover()?);
    let report = relay.drain().await?;
    assert_eq!(report.rows_acknowledged, 1);
    Ok(())
}
