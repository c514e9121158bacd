//! S13 at its edge, on the server backends: ids are assigned at insert, not at commit. A row
//! with a lower id that commits after the relay read its group must survive the
//! acknowledgement of that group and be delivered by a later pass. Each test steps two
//! connections through the interleaving with explicit waits (a handler that holds the relay
//! inside the delivery until told to go on, a connection observed waiting on a row lock), never
//! with sleeps. [`commit_order_tests!`](crate::commit_order_tests) runs them on a backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::handler::Handler;
use outbox_core::{BoxError, Deletion, Delivery, Registry, Relay, RelayConfig, Replication};
use outbox_sqlx::sql::{Executes, With, get};
use outbox_sqlx::{Dialect, SqlxStore, Writable};
use sqlx::{AssertSqlSafe, Database, Pool};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::fixtures::{MODEL_TABLES, ModelSeen, OrgUpdate, Project, Recorder, note, org_shard};
use crate::sqlx::{Provision, SqlxTestDatabase};

type Db<P> = <<P as Provision>::Dialect as Dialect>::Database;

/// Holds a handler inside its delivery: it announces that it entered, then waits for a permit.
#[derive(Clone)]
struct Gate {
    entered: mpsc::UnboundedSender<()>,
    permits: Arc<Semaphore>,
}

impl Gate {
    fn new() -> (Self, mpsc::UnboundedReceiver<()>) {
        let (entered, inside) = mpsc::unbounded_channel();
        let gate = Self {
            entered,
            permits: Arc::new(Semaphore::new(0)),
        };
        (gate, inside)
    }

    async fn pass(&self) {
        let _ = self.entered.send(());
        self.permits
            .acquire()
            .await
            .expect("the gate is never closed")
            .forget();
    }

    /// A handler that records each delivery with `recorder`, then waits at the gate.
    fn recording(&self, recorder: &Recorder) -> impl Handler<Delivery<OrgUpdate>> + use<> {
        let (recorder, gate) = (recorder.clone(), self.clone());
        move |delivery: Delivery<OrgUpdate>| {
            let (recorder, gate) = (recorder.clone(), gate.clone());
            async move {
                recorder.record(&delivery);
                gate.pass().await;
                Ok::<_, BoxError>(())
            }
        }
    }

    /// Lets every waiting and later delivery through.
    fn open(&self) {
        self.permits.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

fn config() -> RelayConfig {
    RelayConfig::builder()
        .wake_on_commit(false)
        .build()
        .expect("a valid relay configuration")
}

async fn pending_ids<D: Dialect>(store: &SqlxStore<D>) -> Vec<i64> {
    store
        .pending_messages(100)
        .await
        .expect("pending")
        .iter()
        .map(|message| message.id.0)
        .collect()
}

/// The server's id of the connection `conn` ([`Provision::LOCK_WAITS`]).
async fn session_id<P: Provision>(conn: &mut <Db<P> as Database>::Connection) -> i64 {
    let (session, _) = P::LOCK_WAITS.expect("the backend's lock waits");
    let row = sqlx::query(AssertSqlSafe(session))
        .fetch_one(Db::<P>::on(conn))
        .await
        .expect("the connection's id");
    get::<Db<P>, i64>(&row, 0).expect("an id")
}

/// Waits until the connection `id` is waiting for a lock held by another transaction.
///
/// It asks every 150 ms, for up to 30 s: MariaDB answers `INNODB_TRX` from a cache that it
/// refreshes only once it has gone 100 ms unread, so asking more often would read the state of
/// the first question for ever.
async fn blocked_on_a_lock<P: Provision>(pool: &Pool<Db<P>>, id: i64) {
    let (_, waiting) = P::LOCK_WAITS.expect("the backend's lock waits");
    for _ in 0..200 {
        let mut conn = pool.acquire().await.expect("a connection");
        let row = sqlx::query(AssertSqlSafe(waiting))
            .with(id)
            .fetch_one(Db::<P>::on(&mut conn))
            .await
            .expect("whether it waits");
        if get::<Db<P>, bool>(&row, 0).expect("a boolean") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    panic!("connection {id} never waited for the row lock");
}

/// A plain coalescing category: transaction A writes to a group and stays open; B writes to the
/// same group (a higher id) and commits; the relay reads B's row alone and, while its handler
/// runs, A commits. Acknowledging B's delivery must leave A's row, which the next pass delivers.
pub async fn a_lower_id_committed_during_delivery_survives_its_group_acknowledgement<
    P: Provision,
>() {
    let database = SqlxTestDatabase::<P>::migrated().await;
    let pool = database.pool();

    let mut a = pool.begin().await.expect("begin A");
    let a_id =
        outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut a), &note::<OrgUpdate>(1, 5, 1))
            .await
            .expect("A writes");
    let mut b = pool.begin().await.expect("begin B");
    let b_id =
        outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut b), &note::<OrgUpdate>(1, 5, 2))
            .await
            .expect("B writes");
    b.commit().await.expect("B commits");
    assert!(a_id < b_id, "A's row has the lower id");

    let recorder = Recorder::new();
    let (gate, mut inside) = Gate::new();
    let handler = gate.recording(&recorder);
    let relay = Relay::with_config(
        SqlxStore::<P::Dialect>::new(pool.clone()),
        recorder.registry_with::<OrgUpdate>(handler),
        config(),
    );
    let drain = tokio::spawn({
        let relay = relay.clone();
        async move { relay.drain().await }
    });

    inside.recv().await.expect("the relay delivers B's row");
    a.commit()
        .await
        .expect("A commits while B's row is being delivered");
    gate.open();
    let report = drain.await.expect("drain task").expect("drain");

    assert_eq!(
        recorder
            .seen()
            .iter()
            .map(|seen| seen.seq)
            .collect::<Vec<_>>(),
        [2, 1],
        "B's payload, then A's: the row committed during the delivery was not acknowledged \
         with it"
    );
    assert_eq!(report.rows_acknowledged, 2);
    assert!(pending_ids(relay.store()).await.is_empty());
}

/// The same race beyond the first read: the group's newest row is found past a full read
/// (batch size 2), and a row between the read and that newest row commits during delivery.
pub async fn a_row_between_the_read_and_the_groups_newest_row_survives<P: Provision>() {
    let database = SqlxTestDatabase::<P>::migrated().await;
    let pool = database.pool();

    let mut first = pool.begin().await.expect("begin");
    outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut first), &note::<OrgUpdate>(1, 5, 1))
        .await
        .expect("write");
    outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut first), &note::<OrgUpdate>(1, 6, 2))
        .await
        .expect("write");
    first.commit().await.expect("commit");
    let mut late = pool.begin().await.expect("begin the late writer");
    let late_id =
        outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut late), &note::<OrgUpdate>(1, 5, 3))
            .await
            .expect("the late writer writes");
    let mut newest = pool.begin().await.expect("begin");
    let newest_id =
        outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut newest), &note::<OrgUpdate>(1, 5, 4))
            .await
            .expect("write the newest");
    newest.commit().await.expect("commit the newest");
    assert!(late_id < newest_id);

    let recorder = Recorder::new();
    let (gate, mut inside) = Gate::new();
    let handler = gate.recording(&recorder);
    let config = config()
        .to_builder()
        .batch_size(2)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(
        SqlxStore::<P::Dialect>::new(pool.clone()),
        recorder.registry_with::<OrgUpdate>(handler),
        config,
    );
    let drain = tokio::spawn({
        let relay = relay.clone();
        async move { relay.drain().await }
    });
    inside.recv().await.expect("the relay delivers object 5");
    late.commit().await.expect("the late writer commits");
    gate.open();
    drain.await.expect("drain task").expect("drain");

    let seen: Vec<(i64, u64)> = recorder
        .seen()
        .iter()
        .map(|seen| {
            (
                i64::try_from(seen.object).expect("an integer object"),
                seen.seq,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(5, 4), (6, 2), (5, 3)],
        "object 5 at its newest visible payload, object 6, then the late row of object 5"
    );
    assert!(pending_ids(relay.store()).await.is_empty());
    assert_eq!(recorder.in_shard(&org_shard(1)).len(), 3);
}

/// The replicated-model race of the issue: S saves project 1 and holds its row lock; D deletes
/// project 1 and waits on that lock; S saves again and commits; D's delete proceeds, and D
/// commits while the relay is replicating the version S saved. The deletion must be delivered.
pub async fn a_deletion_committed_while_its_object_is_replicated_is_delivered<P: Provision>()
where
    Project: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    let pool = database.pool();
    let mut conn = pool.acquire().await.expect("a connection");
    sqlx::query(MODEL_TABLES[0])
        .execute(Db::<P>::on(&mut conn))
        .await
        .expect("projects table");
    sqlx::query(
        "INSERT INTO projects (id, organization_id, name, archived, score) \
         VALUES (1, 7, 'existing', false, 0.5)",
    )
    .execute(Db::<P>::on(&mut conn))
    .await
    .expect("project 1 exists, replicated long ago");
    drop(conn);

    let mut s = outbox_sqlx::begin::<P::Dialect>(pool)
        .await
        .expect("begin S");
    s.save(&Project::new(1, 7, "first")).await.expect("S saves");

    let (pid_sent, pid) = oneshot::channel();
    let (deleted_sent, deleted) = oneshot::channel();
    let (commit, commit_now) = oneshot::channel::<()>();
    let d = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut d = outbox_sqlx::begin::<P::Dialect>(&pool)
                .await
                .expect("begin D");
            let backend = session_id::<P>(&mut d).await;
            pid_sent.send(backend).expect("send D's backend");
            d.delete(&Project::new(1, 7, "first"))
                .await
                .expect("D deletes once S commits");
            deleted_sent.send(()).expect("D deleted");
            commit_now.await.expect("told to commit");
            d.commit().await.expect("D commits")
        }
    });
    let d_backend = pid.await.expect("D's backend");
    blocked_on_a_lock::<P>(pool, d_backend).await;

    s.save(&Project::new(1, 7, "second"))
        .await
        .expect("S saves again");
    s.commit().await.expect("S commits");
    deleted
        .await
        .expect("D's delete went through, D not committed");
    let store = SqlxStore::<P::Dialect>::new(pool.clone());
    let saves = pending_ids(&store).await;
    assert_eq!(saves.len(), 2, "S's two outboxes are visible, D's is not");

    let models = Arc::new(Mutex::new(Vec::new()));
    let (gate, mut inside) = Gate::new();
    let registry = Registry::builder()
        .replication::<Project>({
            let (models, gate) = (models.clone(), gate.clone());
            move |replication: Replication<Project>| {
                let (models, gate) = (models.clone(), gate.clone());
                async move {
                    models
                        .lock()
                        .expect("models")
                        .push(ModelSeen::Project(replication.object, replication.shard));
                    gate.pass().await;
                    Ok::<_, BoxError>(())
                }
            }
        })
        .deletion::<Project>({
            let models = models.clone();
            move |deletion: Deletion<Project>| {
                models.lock().expect("models").push(ModelSeen::ProjectGone(
                    deletion.object_identifier,
                    deletion.shard,
                ));
                async { Ok::<_, BoxError>(()) }
            }
        })
        .build()
        .expect("registry");
    let relay = Relay::with_config(store.clone(), registry, config());
    let drain = tokio::spawn({
        let relay = relay.clone();
        async move { relay.drain().await }
    });

    inside
        .recv()
        .await
        .expect("the relay replicates S's version");
    commit.send(()).expect("tell D to commit");
    let written = d.await.expect("D's task");
    assert_eq!(written.len(), 1, "D wrote to one shard");
    let deletion_id = written.iter().next().expect("D's shard").1;
    assert!(
        saves.iter().all(|&save| save < deletion_id.0),
        "the deletion's outbox is written after the row lock it waited for: its id follows \
         the saves it waited on ({saves:?} < {deletion_id:?})"
    );
    gate.open();
    drain.await.expect("drain task").expect("drain");

    assert_eq!(
        *models.lock().expect("models"),
        [
            ModelSeen::Project(Project::new(1, 7, "second"), org_shard(7)),
            ModelSeen::ProjectGone(1.into(), org_shard(7)),
        ],
        "the version S saved is replicated, then the deletion D committed is delivered"
    );
    assert!(pending_ids(&store).await.is_empty());
}

/// The commit-order tests ([`commit_order`](crate::commit_order)) as `#[test]`s, on the server
/// backend of a [`Provision`] whose [`Provision::LOCK_WAITS`] is given:
/// `outbox_testkit::commit_order_tests!(outbox_testkit::postgres::PgDatabase);`.
#[macro_export]
macro_rules! commit_order_tests {
    ($provision:ty) => {
        $crate::commit_order_tests!(@each $provision;
            a_lower_id_committed_during_delivery_survives_its_group_acknowledgement,
            a_row_between_the_read_and_the_groups_newest_row_survives,
            a_deletion_committed_while_its_object_is_replicated_is_delivered,
        );
    };
    (@each $provision:ty; $($name:ident,)+) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::run($crate::commit_order::$name::<$provision>());
            }
        )+
    };
}
