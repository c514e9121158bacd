//! Recent sweeps against a real PostgreSQL: writers' connections stepped in a fixed order,
//! with no sleeps.

use std::time::Duration;

use outbox_core::ShardKey;
use outbox_core::store::Store;
use outbox_testkit::postgres::PgTestDatabase;

use super::{SLOW, WHOLE_EVERY};
use crate::PgStore;
use crate::dialect::positions::tests::{insert, shard, store};

/// One whole sweep's due shards (its pages read one after another).
async fn sweep(store: &PgStore) -> Vec<ShardKey> {
    let (mut due, mut after) = (Vec::new(), None);
    loop {
        let page = store.discover(after.as_ref(), 2).await.expect("discover");
        due.extend(page.due);
        match page.next {
            Some(next) => after = Some(next),
            None => return due,
        }
    }
}

/// While whole sweeps are slow, a sweep reads only the rows written since the last one
/// began: a shard left pending before it is not read again, a row written since is, and so is
/// a row whose transaction drew its id before that sweep but committed after it (ids are not
/// commit order). A whole sweep still comes once [`WHOLE_EVERY`] has passed, and finds every
/// pending shard.
#[tokio::test]
async fn a_recent_sweep_reads_what_was_written_since_the_last() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    for identifier in [1, 2, 3] {
        insert(&mut writes, identifier, 0).await;
    }
    dialect.positions.sample(pool).await;
    assert_eq!(
        sweep(&store).await,
        vec![shard(1), shard(2), shard(3)],
        "whole"
    );

    // The whole sweep was slow: the next ones are recent.
    dialect.sweeps.set_whole(SLOW * 2, Duration::ZERO);
    insert(&mut writes, 4, 0).await;
    dialect.positions.sample(pool).await;
    assert_eq!(
        sweep(&store).await,
        vec![shard(4)],
        "recent: only the new row"
    );

    // A draws an id and stays open; B commits a higher one.
    let mut a = pool.begin().await.expect("begin A");
    insert(&mut a, 5, 0).await;
    insert(&mut writes, 6, 0).await;
    dialect.positions.sample(pool).await;
    dialect.positions.sample(pool).await;
    assert_eq!(
        sweep(&store).await,
        vec![shard(6)],
        "A's row is not committed yet"
    );
    a.commit().await.expect("commit A");
    dialect.positions.sample(pool).await;
    assert_eq!(
        sweep(&store).await,
        vec![shard(5), shard(6)],
        "A's row, below B's, is read once it commits"
    );

    // The last whole sweep is old enough: the next is whole again.
    dialect.sweeps.set_whole(SLOW * 2, WHOLE_EVERY * 2);
    assert_eq!(
        sweep(&store).await,
        (1..=6).map(shard).collect::<Vec<_>>(),
        "whole again"
    );
}
