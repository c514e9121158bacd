//! Replicated models (SPEC §4): written with their outboxes, looked up at delivery, replicated
//! while present and deleted once gone; fan-out models reach each destination.

use outbox_core::{
    Category, DeliveryError, Destination, Error, HandlerMode, Id, ModelBatch, Registry, Relay,
    Scope, ShardKey,
};

use outbox_core::error::error_chain;

use super::{config, int, pending};
use crate::backend::{ModelWrite, TestBackend};
use crate::fixtures::{
    MODEL_TABLES, Member, MemberTombstone, ModelRecorder, ModelSeen, OrgScope, Project, org_shard,
};
use crate::telemetry::capture;

/// A backend with the model tables.
async fn with_tables<B: TestBackend>() -> B {
    let backend = B::create().await;
    for ddl in MODEL_TABLES {
        backend.execute(ddl).await;
    }
    backend
}

fn registry(recorder: &ModelRecorder) -> Registry {
    recorder
        .register(Registry::builder())
        .build()
        .expect("the test models do not conflict")
}

async fn write<B: TestBackend>(backend: &B, write: ModelWrite, models: ModelBatch<'_, Project>) {
    backend
        .write_models(write, models, true)
        .await
        .expect("write models");
}

/// Each write of a model is one outbox row of its category in its shard; at delivery the
/// relay reads the row as it is then (all column types intact), so the replication handler
/// sees the newest state once; a deleted object reaches the deletion handler with its id.
pub async fn models_replicate_while_present_and_delete_once_gone<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    let recorder = ModelRecorder::default();
    let relay = Relay::with_config(backend.store(), registry(&recorder), config("models"));

    let api = Project::new(1, 7, "api");
    let web = Project {
        note: Some("beta".into()),
        score: 2.25,
        ..Project::new(2, 7, "web")
    };
    let other = Project::new(3, 8, "other");
    let inserted = backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::local(&[api.clone(), web.clone(), other.clone()]),
            true,
        )
        .await
        .expect("insert");
    assert_eq!(inserted, 3);
    let renamed = Project {
        name: "api v2".into(),
        ..api.clone()
    };
    write(&backend, ModelWrite::Update, ModelBatch::local(&renamed)).await;
    let rows = pending(&backend).await;
    assert_eq!(rows.len(), 4, "one outbox per model and write");
    assert!(rows.iter().all(|row| row.category == Project::ID));
    assert_eq!(
        rows.iter()
            .map(|row| (int(row.shard.shard_identifier), int(row.object_identifier)))
            .collect::<Vec<_>>(),
        [(7, 1), (7, 2), (8, 3), (7, 1)]
    );

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let mut seen = recorder.take();
    seen.sort_by_key(|seen| format!("{seen:?}"));
    assert_eq!(
        seen,
        [
            ModelSeen::Project(renamed.clone(), org_shard(7)),
            ModelSeen::Project(web.clone(), org_shard(7)),
            ModelSeen::Project(other, org_shard(8)),
        ]
    );
    assert_eq!(
        report.rows_acknowledged, 4,
        "the two writes of api coalesced"
    );

    // Saved (upserted) then deleted before delivery: only the deletion is delivered.
    let saved = Project {
        name: "web v2".into(),
        ..web.clone()
    };
    let rows = backend
        .write_models(ModelWrite::Save, ModelBatch::local(&saved), true)
        .await
        .expect("save");
    assert_eq!(rows, 1);
    let deleted = backend
        .write_models(
            ModelWrite::Delete,
            ModelBatch::local(&[saved, renamed]),
            true,
        )
        .await
        .expect("delete");
    assert_eq!(deleted, 2);
    relay.drain().await.expect("drain");
    assert_eq!(
        recorder.take(),
        [
            ModelSeen::ProjectGone(Id::integer(2), org_shard(7)),
            ModelSeen::ProjectGone(Id::integer(1), org_shard(7)),
        ]
    );
}

/// In the in-transaction handler mode, the relay reads the object within the claiming
/// transaction: what the handlers see is what that transaction sees.
pub async fn models_are_read_in_the_claiming_transaction<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    let recorder = ModelRecorder::default();
    let config = config("models-in-tx")
        .to_builder()
        .handler_mode(HandlerMode::InTransaction)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(backend.store(), registry(&recorder), config);
    let api = Project::new(1, 7, "api");
    write(&backend, ModelWrite::Save, ModelBatch::local(&api)).await;
    write(
        &backend,
        ModelWrite::Delete,
        ModelBatch::local(&Project::new(2, 7, "gone")),
    )
    .await;
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        recorder.take(),
        [
            ModelSeen::Project(api, org_shard(7)),
            ModelSeen::ProjectGone(Id::integer(2), org_shard(7)),
        ]
    );
    assert!(pending(&backend).await.is_empty());
}

/// A model write rolled back leaves neither rows nor outboxes; a failed model write (a key
/// inserted twice) fails as a whole, writing no outbox.
pub async fn model_writes_commit_and_roll_back_with_the_transaction<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::local(&Project::new(1, 7, "api")),
            false,
        )
        .await
        .expect("insert, rolled back");
    assert!(pending(&backend).await.is_empty());

    write(
        &backend,
        ModelWrite::Insert,
        ModelBatch::local(&Project::new(1, 7, "api")),
    )
    .await;
    let error = backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::local(&[Project::new(2, 7, "new"), Project::new(1, 7, "again")]),
            true,
        )
        .await
        .expect_err("the key exists");
    assert!(matches!(error, Error::Database { .. }), "{error:?}");
    assert_eq!(pending(&backend).await.len(), 1, "only the first insert's");

    let recorder = ModelRecorder::default();
    Relay::with_config(backend.store(), registry(&recorder), config("rollback"))
        .drain()
        .await
        .expect("drain");
    assert_eq!(
        recorder.take(),
        [ModelSeen::Project(Project::new(1, 7, "api"), org_shard(7))]
    );
}

/// A model write that names one key twice is refused as a whole, on every backend and for
/// every write, before anything is written: [`Error::DuplicateKey`] names the model and the
/// key. (Which of the two should the row hold? A database would refuse one write, keep either
/// row, or update by either.)
pub async fn a_key_twice_in_one_model_write_is_refused<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    let original = Project::new(1, 7, "api");
    write(&backend, ModelWrite::Insert, ModelBatch::local(&original)).await;
    let twice = [
        Project::new(1, 7, "first"),
        Project::new(2, 7, "other"),
        Project::new(1, 7, "second"),
    ];
    for kind in [
        ModelWrite::Insert,
        ModelWrite::Update,
        ModelWrite::Save,
        ModelWrite::Delete,
    ] {
        let error = backend
            .write_models(kind, ModelBatch::local(&twice), true)
            .await
            .expect_err("a key twice in one write");
        assert!(
            matches!(error, Error::DuplicateKey { model, key } if model == Project::NAME && key == 1),
            "{kind:?}: {error:?}"
        );
    }
    assert_eq!(pending(&backend).await.len(), 1, "only the first insert's");
    let recorder = ModelRecorder::default();
    Relay::with_config(backend.store(), registry(&recorder), config("duplicates"))
        .drain()
        .await
        .expect("drain");
    assert_eq!(
        recorder.take(),
        [ModelSeen::Project(original, org_shard(7))],
        "the row is as the first insert wrote it, and project 2 was never written"
    );
}

/// A fan-out model's write gives each destination its own row, shard and handler call, and
/// the deletion handler gets the tombstone saved by the write.
pub async fn fan_out_models_reach_each_destination<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    let recorder = ModelRecorder::default();
    let relay = Relay::with_config(backend.store(), registry(&recorder), config("fan-out"));
    let regions = || ["eu", "us", "ap"].map(|name| Destination::new(name).expect("valid"));
    let members = [
        Member {
            member_id: 1,
            org: 7,
            email: "ada@example.com".into(),
        },
        Member {
            member_id: 2,
            org: 7,
            email: "bob@example.com".into(),
        },
    ];

    let rows = backend
        .write_models(ModelWrite::Save, ModelBatch::to(&members, regions()), true)
        .await
        .expect("save members");
    assert_eq!(rows, 2);
    let pending_rows = pending(&backend).await;
    assert_eq!(pending_rows.len(), 6, "one row per member and destination");
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.shards_claimed, 3, "one shard per destination");
    let mut seen: Vec<_> = recorder
        .take()
        .into_iter()
        .map(|seen| match seen {
            ModelSeen::Member(member, shard) => {
                (shard.destination_str().to_owned(), member.member_id)
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("ap".to_owned(), 1),
            ("ap".to_owned(), 2),
            ("eu".to_owned(), 1),
            ("eu".to_owned(), 2),
            ("us".to_owned(), 1),
            ("us".to_owned(), 2),
        ]
    );

    let deleted = backend
        .write_models(
            ModelWrite::Delete,
            ModelBatch::to(&members[..1], [Destination::new("eu").expect("valid")]),
            true,
        )
        .await
        .expect("delete a member");
    assert_eq!(deleted, 1);
    relay.drain().await.expect("drain");
    let eu = ShardKey::fan_out(OrgScope::ID, 7, Destination::new("eu").expect("valid"));
    assert_eq!(
        recorder.take(),
        [ModelSeen::MemberGone(
            Id::integer(1),
            eu,
            MemberTombstone {
                email: "ada@example.com".into()
            }
        )]
    );
}

/// A row that no longer reads as its model, or a table the relay cannot read, is a precise
/// failure of its shard: nothing is deleted, and other shards carry on.
pub async fn unreadable_model_rows_are_precise_failures<B: TestBackend>() {
    let backend = with_tables::<B>().await;
    let recorder = ModelRecorder::default();
    let relay = Relay::with_config(backend.store(), registry(&recorder), config("bad-rows"));
    write(
        &backend,
        ModelWrite::Insert,
        ModelBatch::local(&[Project::new(1, 7, "api"), Project::new(2, 8, "web")]),
    )
    .await;
    let member = Member {
        member_id: 1,
        org: 9,
        email: "ada@example.com".into(),
    };
    backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::to(&member, [Destination::new("eu").expect("valid")]),
            true,
        )
        .await
        .expect("insert a member");
    // Behind the model's back: a NULL where it reads a string, and its table gone.
    backend
        .execute("UPDATE projects SET name = NULL WHERE id = 1")
        .await;
    backend.execute("DROP TABLE members").await;

    let report = relay.drain().await.expect("bad rows do not fail the drain");
    assert_eq!(
        recorder.take(),
        [ModelSeen::Project(Project::new(2, 8, "web"), org_shard(8))]
    );
    let mut failures: Vec<_> = report.failures.iter().collect();
    failures.sort_by_key(|failure| failure.shard.shard_identifier);
    assert_eq!(failures.len(), 2, "{report:?}");

    assert_eq!(failures[0].shard, org_shard(7));
    assert!(
        matches!(
            &failures[0].error,
            DeliveryError::Row {
                model: "project",
                table: "projects",
                object_identifier,
                ..
            } if *object_identifier == 1
        ),
        "{:?}",
        failures[0].error
    );
    let text = error_chain(&failures[0].error);
    assert!(
        text.contains("row 1 of `projects` does not deserialize as replicated model `project`")
            && text.contains("invalid type: null"),
        "{text}"
    );

    assert!(
        matches!(
            &failures[1].error,
            DeliveryError::Lookup {
                model: "member",
                table: "members",
                object_identifier,
                ..
            } if *object_identifier == 1
        ),
        "{:?}",
        failures[1].error
    );
    let text = error_chain(&failures[1].error);
    assert!(text.contains("members"), "{text}");
    assert_eq!(pending(&backend).await.len(), 2, "the failed outboxes stay");
}

/// The rows of the objects whose outboxes many shards' drains deliver are read together: one
/// statement per model for the shards drained at the same time, not one per delivery. Each
/// delivery still sees its object's row as it stands after its newest message.
pub fn models_of_many_shards_are_read_together<B: TestBackend>() {
    const SHARDS: i64 = 32;
    let (seen, telemetry) = capture(|_| async {
        let backend = with_tables::<B>().await;
        let recorder = ModelRecorder::default();
        let relay = Relay::with_config(backend.store(), registry(&recorder), config("together"));
        // Two objects in each shard; the first of each renamed after its first write.
        let projects: Vec<Project> = (0..SHARDS * 2)
            .map(|id| Project::new(id + 1, id / 2 + 1, "first"))
            .collect();
        write(&backend, ModelWrite::Insert, ModelBatch::local(&projects)).await;
        let renamed: Vec<Project> = projects
            .iter()
            .step_by(2)
            .map(|project| Project {
                name: "renamed".into(),
                ..project.clone()
            })
            .collect();
        write(&backend, ModelWrite::Update, ModelBatch::local(&renamed)).await;
        let report = relay.drain().await.expect("drain");
        assert!(report.is_clean(), "{report:?}");
        assert!(pending(&backend).await.is_empty(), "everything delivered");
        recorder.take()
    });
    let mut seen: Vec<(i64, String)> = seen
        .into_iter()
        .map(|seen| match seen {
            ModelSeen::Project(project, _) => (project.id, project.name),
            other => panic!("only projects were written: {other:?}"),
        })
        .collect();
    seen.sort();
    let expected: Vec<(i64, String)> = (1..=SHARDS * 2)
        .map(|id| (id, if id % 2 == 1 { "renamed" } else { "first" }.to_owned()))
        .collect();
    assert_eq!(seen, expected, "each object once, as it stands");

    let loads = telemetry.spans("outbox.load_models");
    let rows: usize = loads
        .iter()
        .map(|load| {
            load.field("rows")
                .and_then(|rows| rows.parse::<usize>().ok())
                .expect("a read says how many rows it read")
        })
        .sum();
    assert_eq!(rows, expected.len(), "every row read together: {loads:?}");
    assert!(
        loads.len() <= (SHARDS / 2) as usize,
        "{} reads for {SHARDS} shards: the drains' rows are not read together: {:?}",
        loads.len(),
        loads
            .iter()
            .map(|load| load.field("rows"))
            .collect::<Vec<_>>()
    );
}
