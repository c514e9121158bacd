//! `outbox_testkit::recorder`: recordings see every delivery, in order, for any category and
//! any replicated model.

use std::time::Duration;

use outbox_core::{
    Category, CategoryId, Destination, Id, Message, ModelBatch, Registry, Scope, ShardKey,
};
use outbox_testkit::fixtures::{
    Member, MemberTombstone, Note, OrgScope, OrgUpdate, Project, ProjectUpdate, note, org_shard,
};
use outbox_testkit::inspect::assert_no_pending;
use outbox_testkit::recorder::{ModelEvent, ModelRecording, Recording};
use serde::{Deserialize, Serialize};

use super::{Db, panic_message};

/// A payload that is not `Clone`: a recording still records it, and hands it back by `take`.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Renamed {
    name: String,
}

/// A category of the test's own.
struct TeamRenamed;
impl Category for TeamRenamed {
    type Scope = OrgScope;
    type Payload = Renamed;
    const ID: CategoryId = CategoryId(40);
    const NAME: &'static str = "team_renamed";
}

fn renamed(shard: i64, object: i64, name: &str) -> Message {
    Message::new::<TeamRenamed>(shard, object, &Renamed { name: name.into() }).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_records_every_delivery_in_order() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let relay = db.relay(recording.register(Registry::builder()).build().unwrap());
    // A1 B1 A2 in shard 1, C1 in shard 2: A (newest payload), then B; C in its own shard.
    db.write(&[note::<OrgUpdate>(1, 10, 1)]).await;
    db.write(&[note::<OrgUpdate>(1, 20, 2)]).await;
    db.write(&[note::<OrgUpdate>(1, 10, 3), note::<OrgUpdate>(2, 30, 4)])
        .await;

    let report = relay.drain().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(recording.len(), 3);
    let shard_1 = recording.in_shard(&org_shard(1));
    assert_eq!(
        shard_1
            .iter()
            .map(|seen| (seen.object_identifier, seen.payload.seq))
            .collect::<Vec<_>>(),
        [(Id::integer(10), 3), (Id::integer(20), 2)],
        "in order of each group's oldest row, with its newest payload"
    );
    assert_eq!(
        shard_1[0].message_id.0, 3,
        "the newest message of the group"
    );
    assert!(
        shard_1
            .iter()
            .all(|seen| seen.attempt == 1 && seen.fencing_token > 0)
    );
    assert_eq!(recording.in_shard(&org_shard(2))[0].payload, Note::new(4));
    let mut pairs = recording.objects_and_payloads();
    pairs.sort_by_key(|(object, _)| *object);
    assert_eq!(
        pairs,
        [
            (Id::integer(10), Note::new(3)),
            (Id::integer(20), Note::new(2)),
            (Id::integer(30), Note::new(4))
        ]
    );
    assert_eq!(recording.seen().len(), 3, "reading does not consume");

    let taken = recording.take();
    assert_eq!(taken.len(), 3);
    assert!(recording.is_empty(), "take empties the recording");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_of_several_categories_keep_apart() {
    let db = Db::new().await;
    let teams = Recording::<TeamRenamed>::new();
    let projects = Recording::<ProjectUpdate>::new();
    let registry = projects
        .register(teams.register(Registry::builder()))
        .build()
        .unwrap();
    let relay = db.relay(registry);
    db.write(&[
        renamed(1, 1, "core"),
        note::<ProjectUpdate>(1, 1, 1),
        renamed(1, 2, "web"),
    ])
    .await;
    assert!(relay.drain().await.unwrap().is_clean());

    let teams_seen = teams.take();
    assert_eq!(
        teams_seen
            .into_iter()
            .map(|seen| (seen.object_identifier, seen.payload))
            .collect::<Vec<_>>(),
        [
            (
                Id::integer(1),
                Renamed {
                    name: "core".into()
                }
            ),
            (Id::integer(2), Renamed { name: "web".into() })
        ]
    );
    assert_eq!(projects.payloads(), [Note::new(1)]);
    assert_eq!(projects.shards(), [ShardKey::local(OrgScope::ID, 1)]);
}

/// `wait_for` returns once a running relay delivered enough, and panics, saying how many it
/// saw, when it did not in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_follows_a_running_relay_and_times_out_loudly() {
    let db = Db::new().await;
    let recording = Recording::<OrgUpdate>::new();
    let relay = db.relay(recording.register(Registry::builder()).build().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });

    db.write(&[note::<OrgUpdate>(1, 1, 1), note::<OrgUpdate>(2, 2, 2)])
        .await;
    recording.wait_for(2, Duration::from_secs(10)).await;
    let mut objects = recording.objects();
    objects.sort_unstable();
    assert_eq!(objects, [1, 2]);

    // The wait can run on a task of its own.
    let waiting = tokio::spawn({
        let recording = recording.clone();
        async move { recording.wait_for(2, Duration::from_secs(10)).await }
    });
    waiting.await.unwrap();
    let message = panic_message(recording.wait_for(3, Duration::from_millis(200))).await;
    assert_eq!(
        message,
        "waited 200ms for 3 deliveries of category `org_update`; 2 recorded"
    );

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_no_pending(&db.store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_recording_records_replications_and_deletions_in_order() {
    let db = Db::new().await;
    let recording = ModelRecording::<Project>::new();
    let relay = db.relay(recording.register(Registry::builder()).build().unwrap());
    let api = Project::new(1, 7, "api");
    let web = Project::new(2, 7, "web");
    let mut tx = db.database.pool().begin().await.unwrap();
    outbox_sqlite::insert(&mut tx, ModelBatch::local(&[api.clone(), web.clone()]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(relay.drain().await.unwrap().is_clean());

    let mut tx = db.database.pool().begin().await.unwrap();
    outbox_sqlite::delete(&mut tx, ModelBatch::local(&api))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(relay.drain().await.unwrap().is_clean());

    assert_eq!(recording.objects(), [1, 2, 1]);
    assert_eq!(recording.replicated(), [api, web]);
    assert_eq!(recording.deleted(), [1]);
    let events = recording.events();
    assert!(matches!(&events[2], ModelEvent::Deleted(deleted)
        if deleted.shard == org_shard(7) && deleted.attempt == 1));
    assert_eq!(recording.take().len(), 3);
    assert!(recording.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_recording_sees_each_destination_and_the_tombstone() {
    let db = Db::new().await;
    let recording = ModelRecording::<Member>::new();
    let relay = db.relay(recording.register(Registry::builder()).build().unwrap());
    let member = Member {
        member_id: 3,
        org: 9,
        email: "m@example.com".into(),
    };
    let destinations = ["eu", "us"].map(|name| Destination::new(name).unwrap());
    for delete in [false, true] {
        let mut tx = db.database.pool().begin().await.unwrap();
        let batch = ModelBatch::to(&member, destinations.clone());
        if delete {
            outbox_sqlite::delete(&mut tx, batch).await.unwrap();
        } else {
            outbox_sqlite::insert(&mut tx, batch).await.unwrap();
        }
        tx.commit().await.unwrap();
        assert!(relay.drain().await.unwrap().is_clean());
    }

    let mut replicated_to: Vec<_> = recording
        .events()
        .iter()
        .filter(|event| matches!(event, ModelEvent::Replicated(_)))
        .map(|event| event.shard().destination_str().to_owned())
        .collect();
    replicated_to.sort();
    assert_eq!(replicated_to, ["eu", "us"]);
    assert_eq!(recording.replicated(), [member.clone(), member]);
    let tombstone = MemberTombstone {
        email: "m@example.com".into(),
    };
    assert_eq!(recording.tombstones(), [tombstone.clone(), tombstone]);
    assert_eq!(recording.deleted(), [3, 3]);
}
