//! Replicated models as a user declares them: `#[replicated_model]` on domain structs, their
//! replication and deletion handlers with `#[outbox_handler]`, written with the backend's model
//! writes and delivered by a relay that reads the rows back, here on the in-memory store. The
//! same deliveries through SQL are the conformance suite's `models_*` and
//! `fan_out_models_reach_each_destination` (both backends), and macro-declared models on SQL
//! are the `regions` and `quickstart` examples' tests.

use outbox_core::memory::MemoryStore;
use outbox_core::{
    BoxError, Category, CategoryId, Deletion, Destination, Id, ModelBatch, Registry, Relay,
    ReplicatedModel, Replication, State, outbox_handler, outbox_scope, replicated_model,
};
use serde::{Deserialize, Serialize};

mod common;
use common::Seen;

#[outbox_scope(id = 1)]
struct Organization;

/// A local model: outboxes stay in this database.
#[replicated_model(scope = Organization, id = 20, table = "projects", shard = organization_id)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Project {
    id: i64,
    organization_id: i64,
    name: String,
    archived: bool,
}

/// What the deletion handler of a member needs once the row is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemberTombstone {
    email: String,
}

impl From<&Member> for MemberTombstone {
    fn from(member: &Member) -> Self {
        Self {
            email: member.email.clone(),
        }
    }
}

/// A fan-out model: each write names the regions it goes to.
#[replicated_model(
    scope = Organization,
    id = 21,
    table = "members",
    shard = org,
    key = member_id,
    tombstone = MemberTombstone,
    fan_out,
    max_attempts = 4
)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Member {
    member_id: i32,
    org: i32,
    email: String,
}

#[outbox_handler]
async fn replicate_project(
    replication: Replication<Project>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let project = &replication.object;
    seen.push(format!(
        "replicate project {} {:?} archived={} in org {}",
        project.id,
        project.name,
        project.archived,
        replication.shard_identifier()
    ));
    Ok(())
}

#[outbox_handler]
async fn delete_project(
    deletion: Deletion<Project>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    seen.push(format!(
        "delete project {} in org {}",
        deletion.object_identifier,
        deletion.shard_identifier()
    ));
    Ok(())
}

#[outbox_handler]
async fn replicate_member(
    replication: Replication<Member>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let destination = replication.destination().ok_or("no destination")?;
    seen.push(format!(
        "replicate member {} {} to {destination}",
        replication.object.member_id, replication.object.email
    ));
    Ok(())
}

#[outbox_handler]
async fn delete_member(
    deletion: Deletion<Member>,
    State(seen): State<Seen>,
) -> Result<(), BoxError> {
    let destination = deletion.destination().ok_or("no destination")?;
    seen.push(format!(
        "delete member {} {} from {destination}",
        deletion.object_identifier, deletion.payload.email
    ));
    Ok(())
}

fn drain(store: &MemoryStore, seen: &Seen) -> impl Future<Output = Vec<String>> {
    let registry = Registry::builder()
        .discovered()
        .state(seen.clone())
        .build()
        .expect("registry");
    let relay = Relay::new(store.clone(), registry);
    let seen = seen.clone();
    async move {
        let report = relay.drain().await.expect("drain");
        assert!(report.is_clean(), "{report:?}");
        seen.take()
    }
}

fn project(id: i64, name: &str) -> Project {
    Project {
        id,
        organization_id: 7,
        name: name.into(),
        archived: id % 2 == 0,
    }
}

#[test]
fn the_model_is_its_own_category() {
    assert_eq!(Project::ID, CategoryId(20));
    assert_eq!(Project::NAME, "project");
    let table = Project::TABLE;
    assert_eq!(
        (table.table, table.key, table.columns),
        (
            "projects",
            "id",
            &["id", "organization_id", "name", "archived"][..],
        )
    );
    assert_eq!(Member::TABLE.key, "member_id");
    let member = Member {
        member_id: 3,
        org: 9,
        email: "a@example.com".into(),
    };
    assert_eq!(
        (member.object_identifier(), member.shard_identifier()),
        (Id::integer(3), Id::integer(9))
    );
    assert_eq!(member.tombstone().email, "a@example.com");
}

#[test]
fn discover_knows_the_models_and_their_tables() {
    let registry = Registry::builder()
        .discovered()
        .state(Seen::default())
        .build()
        .expect("consistent declarations");
    let info = registry.category(CategoryId(20)).expect("project");
    assert_eq!(info.model, Some(Project::TABLE));
    assert!(
        info.identity.coalesce,
        "a replicated model coalesces to its newest state"
    );
    assert!(!info.no_op);
    assert_eq!(info.identity.max_attempts, None, "blocks by default");
    let member = registry.category(CategoryId(21)).expect("member");
    assert_eq!(
        (Member::MAX_ATTEMPTS, member.identity.max_attempts),
        (Some(4), Some(4))
    );
}

#[tokio::test]
async fn present_objects_replicate_and_gone_ones_are_deleted() {
    let store = MemoryStore::new();
    let seen = Seen::default();

    // Create, then update twice: one replication of the newest state.
    store.save(&[project(1, "api"), project(2, "web")]).unwrap();
    store.save(&project(1, "api v2")).unwrap();
    store.save(&project(1, "api v3")).unwrap();
    assert_eq!(
        drain(&store, &seen).await,
        [
            "replicate project 1 \"api v3\" archived=false in org 7",
            "replicate project 2 \"web\" archived=true in org 7",
        ]
    );

    // Delete: the deletion handler runs with the identifiers.
    store.delete(&project(2, "web")).unwrap();
    assert_eq!(drain(&store, &seen).await, ["delete project 2 in org 7"]);

    // Saved, then deleted before delivery: only the deletion is delivered.
    store.save(&project(3, "tmp")).unwrap();
    store.delete(&project(3, "tmp")).unwrap();
    assert_eq!(drain(&store, &seen).await, ["delete project 3 in org 7"]);
}

#[tokio::test]
async fn fan_out_models_reach_each_destination() {
    let store = MemoryStore::new();
    let seen = Seen::default();
    let regions = || ["eu", "us"].map(|name| Destination::new(name).unwrap());
    let member = Member {
        member_id: 5,
        org: 9,
        email: "ada@example.com".into(),
    };

    store.save(ModelBatch::to(&member, regions())).unwrap();
    let mut lines = drain(&store, &seen).await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "replicate member 5 ada@example.com to eu",
            "replicate member 5 ada@example.com to us",
        ]
    );

    store.delete(ModelBatch::to(&member, regions())).unwrap();
    let mut lines = drain(&store, &seen).await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "delete member 5 ada@example.com from eu",
            "delete member 5 ada@example.com from us",
        ]
    );
}
