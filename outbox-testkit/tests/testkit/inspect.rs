//! `outbox_testkit::inspect`: each assertion passes when the pending outboxes are as expected,
//! and otherwise fails with a message showing what was pending instead.

use outbox_core::{Destination, Id, Registry};
use outbox_testkit::faults::Faulty;
use outbox_testkit::fixtures::{
    AuditEvent, FutureCategory, Note, OrgUpdate, ProjectUpdate, UserUpdate, note, org_shard,
};
use outbox_testkit::inspect::{
    Expected, Pending, assert_no_pending, assert_one_pending, assert_pending,
    assert_pending_payload,
};
use outbox_testkit::recorder::Recording;

use super::{Db, panic_message, sync_panic_message};

/// Rows 1..=3: project_update of object 7 in shard 3 twice, then org_update of object 7 in
/// shard 3.
async fn three_rows() -> Db {
    let db = Db::new().await;
    db.write(&[
        note::<ProjectUpdate>(3, 7, 1),
        note::<ProjectUpdate>(3, 7, 2),
        note::<OrgUpdate>(3, 7, 3),
    ])
    .await;
    db
}

#[tokio::test]
async fn pending_lists_written_rows_with_their_addresses_and_payloads() {
    let db = Db::new().await;
    let eu = Destination::new("eu").unwrap();
    db.write(&[
        note::<ProjectUpdate>(3, 7, 1),
        note::<UserUpdate>(4, 8, 2).with_destination(eu.clone()),
    ])
    .await;

    let pending = Pending::of(&db.store).await;
    assert_eq!(pending.len(), 2);
    let [project, user] = pending.rows() else {
        panic!("two rows")
    };
    assert!(project.is::<ProjectUpdate>() && !project.is::<OrgUpdate>());
    assert_eq!(
        (
            project.scope().0,
            project.shard_identifier(),
            project.object_identifier
        ),
        (1, Id::integer(3), Id::integer(7))
    );
    assert_eq!(project.destination(), None);
    assert_eq!(project.category_name, None, "no registry, no name");
    assert_eq!(project.payload_as::<ProjectUpdate>().unwrap(), Note::new(1));
    assert_eq!(
        project.payload,
        Some(serde_json::json!({"seq": 1, "text": "note 1"}))
    );
    assert_eq!((user.scope().0, user.destination()), (2, Some(&eu)));
    assert_eq!(pending.payloads::<UserUpdate>(), [Note::new(2)]);
    assert_eq!(pending.of_category::<ProjectUpdate>().len(), 1);

    let registry = Recording::<ProjectUpdate>::new()
        .register(Registry::builder())
        .build()
        .unwrap();
    let named = pending.named(&registry);
    assert_eq!(named.rows()[0].category_name, Some("project_update"));
    assert_eq!(named.rows()[1].category_name, None, "not in the registry");
    assert_eq!(
        named.to_string(),
        "2 pending:\n\
         \x20 id  scope  shard  destination  category             object  payload\n\
         \x20  1  1      3      -            project_update (#2)  7       {\"seq\":1,\"text\":\"note 1\"}\n\
         \x20  2  2      4      eu           #4                   8       {\"seq\":2,\"text\":\"note 2\"}"
    );

    // Inspection does not deliver: the rows are still there for the relay.
    let recording = Recording::<ProjectUpdate>::new();
    let relay = db.relay(
        recording
            .register(Recording::<UserUpdate>::new().register(Registry::builder()))
            .build()
            .unwrap(),
    );
    assert_eq!(
        Pending::of_relay(&relay).await.rows()[1].category_name,
        Some("user_update")
    );
    assert!(relay.drain().await.unwrap().is_clean());
    assert_eq!(recording.len(), 1);
    assert!(Pending::of(&db.store).await.is_empty());
}

#[tokio::test]
async fn assert_no_pending_passes_once_everything_is_delivered() {
    let db = three_rows().await;
    let relay = db.relay(
        Recording::<OrgUpdate>::new()
            .register(Recording::<ProjectUpdate>::new().register(Registry::builder()))
            .build()
            .unwrap(),
    );
    relay.drain().await.unwrap();
    assert_no_pending(&db.store).await;
    assert_eq!(Pending::of(&db.store).await.to_string(), "nothing pending");
}

#[tokio::test]
async fn assert_no_pending_fails_showing_the_rows_and_the_failing_shards() {
    let db = three_rows().await;
    let relay = db.relay(
        Registry::builder()
            .handle::<ProjectUpdate>(Faulty::fail_always())
            .handle::<OrgUpdate>(Faulty::fail_always())
            .build()
            .unwrap(),
    );
    relay.drain().await.unwrap();

    let message = panic_message(assert_no_pending(&db.store)).await;
    assert_eq!(
        message,
        "expected no pending outboxes; found 3 pending:\n\
         \x20 id  scope  shard  destination  category  object  payload\n\
         \x20  1  1      3      -            #2        7       {\"seq\":1,\"text\":\"note 1\"}\n\
         \x20  2  1      3      -            #2        7       {\"seq\":2,\"text\":\"note 2\"}\n\
         \x20  3  1      3      -            #1        7       {\"seq\":3,\"text\":\"note 3\"}\n\
         shards whose deliveries failed:\n\
         \x20 scope 1 shard 3: 1 failed attempt(s); last error: handler for category \
         `project_update` failed on message 2: injected failure on call 1, failing every call \
         (delivery attempt 1 of object 7 in scope 1 shard 3)"
    );
}

#[tokio::test]
async fn assert_one_pending_passes_on_exactly_one_match() {
    let db = three_rows().await;
    let row = assert_one_pending::<OrgUpdate>(&db.store, 3, 7).await;
    assert_eq!(
        (row.id.0, row.payload_as::<OrgUpdate>().unwrap()),
        (3, Note::new(3))
    );
    let pending = Pending::of(&db.store).await;
    assert_eq!(pending.assert_one(&Expected::of::<OrgUpdate>(3, 7)).id.0, 3);
    pending.assert_count(&Expected::of::<ProjectUpdate>(3, 7), 2);
    pending.assert_count(&Expected::any_object::<ProjectUpdate>(3), 2);
    pending.assert_none(&Expected::of::<ProjectUpdate>(3, 8));
    pending.assert_none(&Expected::of::<ProjectUpdate>(4, 7));
    pending.assert_none(&Expected::of::<AuditEvent>(3, 7));
    pending.assert_none(&Expected::of::<OrgUpdate>(3, 7).to("eu"));
}

#[tokio::test]
async fn assert_one_pending_fails_on_two_matches_marking_them() {
    let db = three_rows().await;
    let message = panic_message(async {
        assert_one_pending::<ProjectUpdate>(&db.store, 3, 7).await;
    })
    .await;
    assert_eq!(
        message,
        "expected one pending outbox of category `project_update` (#2) for object 7 in scope 1 \
         shard 3; found 2 matching among 3 pending:\n\
         \x20    id  scope  shard  destination  category             object  payload\n\
         \x20 *   1  1      3      -            project_update (#2)  7       {\"seq\":1,\"text\":\"note 1\"}\n\
         \x20 *   2  1      3      -            project_update (#2)  7       {\"seq\":2,\"text\":\"note 2\"}\n\
         \x20     3  1      3      -            #1                   7       {\"seq\":3,\"text\":\"note 3\"}\n\
         \x20 (* matches)"
    );
}

#[tokio::test]
async fn assert_one_pending_fails_on_no_match_showing_what_is_there() {
    let db = three_rows().await;
    let pending = Pending::of(&db.store).await;
    for expected in [
        Expected::of::<OrgUpdate>(3, 8),
        Expected::of::<OrgUpdate>(4, 7),
        Expected::of::<AuditEvent>(3, 7),
        Expected::of::<OrgUpdate>(3, 7).to("eu"),
    ] {
        let message = sync_panic_message(|| {
            pending.assert_one(&expected);
        });
        assert!(
            message.starts_with(&format!(
                "expected one pending outbox of {expected}; found none matching among 3 pending:\n"
            )),
            "{message}"
        );
        assert_eq!(
            message.matches("note ").count(),
            3,
            "every row shown: {message}"
        );
        assert!(!message.contains('*'), "nothing marked: {message}");
    }
    let message = panic_message(async {
        assert_one_pending::<OrgUpdate>(&Db::new().await.store, 3, 7).await;
    })
    .await;
    assert_eq!(
        message,
        "expected one pending outbox of category `org_update` (#1) for object 7 in scope 1 \
         shard 3; found nothing pending"
    );
}

#[tokio::test]
async fn count_and_none_assertions_fail_with_the_table() {
    let db = three_rows().await;
    let pending = Pending::of(&db.store).await;
    let message = sync_panic_message(|| pending.assert_none(&Expected::of::<OrgUpdate>(3, 7)));
    assert!(
        message.starts_with(
            "expected no pending outbox of category `org_update` (#1) for object 7 in scope 1 \
             shard 3; found 1 matching among 3 pending:\n"
        ),
        "{message}"
    );
    assert!(message.contains("\n  *   3  1"), "{message}");
    let message = sync_panic_message(|| {
        pending.assert_count(&Expected::any_object::<ProjectUpdate>(3), 3);
    });
    assert!(
        message.starts_with(
            "expected 3 pending outboxes of category `project_update` (#2) for any object in \
             scope 1 shard 3; found 2 matching among 3 pending:\n"
        ),
        "{message}"
    );
    let message = sync_panic_message(|| Pending::clone(&pending).assert_empty());
    assert!(
        message.starts_with("expected no pending outboxes; found 3 pending:\n"),
        "{message}"
    );
}

#[tokio::test]
async fn assert_pending_payload_compares_the_payload() {
    let db = three_rows().await;
    let row = assert_pending_payload::<OrgUpdate>(&db.store, 3, 7, &Note::new(3)).await;
    assert_eq!(row.id.0, 3);

    let message = panic_message(async {
        assert_pending_payload::<OrgUpdate>(&db.store, 3, 7, &Note::new(4)).await;
    })
    .await;
    assert_eq!(
        message,
        "expected one pending outbox of category `org_update` (#1) for object 7 in scope 1 \
         shard 3 with payload {\"seq\":4,\"text\":\"note 4\"}; found none matching among 3 \
         pending:\n\
         \x20    id  scope  shard  destination  category         object  payload\n\
         \x20     1  1      3      -            #2               7       {\"seq\":1,\"text\":\"note 1\"}\n\
         \x20     2  1      3      -            #2               7       {\"seq\":2,\"text\":\"note 2\"}\n\
         \x20 ~   3  1      3      -            org_update (#1)  7       {\"seq\":3,\"text\":\"note 3\"}\n\
         \x20 (~ matches but for its payload)"
    );
}

#[tokio::test]
async fn assert_pending_checks_every_row_in_order() {
    let db = three_rows().await;
    let eu = Destination::new("eu").unwrap();
    db.write(&[note::<OrgUpdate>(3, 9, 4).with_destination(eu)])
        .await;
    let expected = [
        Expected::of::<ProjectUpdate>(3, 7),
        Expected::with_payload::<ProjectUpdate>(3, 7, &Note::new(2)),
        Expected::of::<OrgUpdate>(3, 7),
        Expected::of::<OrgUpdate>(3, 9).to("eu"),
    ];
    assert_pending(&db.store, &expected).await;

    // One missing, one extra, out of order, a wrong payload, local for fan-out: each fails.
    let swapped = [
        expected[2].clone(),
        expected[1].clone(),
        expected[0].clone(),
        expected[3].clone(),
    ];
    let wrong_payload = [
        expected[0].clone(),
        Expected::with_payload::<ProjectUpdate>(3, 7, &Note::new(1)),
        expected[2].clone(),
        expected[3].clone(),
    ];
    let local = [
        expected[0].clone(),
        expected[1].clone(),
        expected[2].clone(),
        Expected::of::<OrgUpdate>(3, 9),
    ];
    let cases: [(&[Expected], &str); 5] = [
        (&expected[..3], "row 4 (message 4) is extra"),
        (
            &[
                expected[0].clone(),
                expected[1].clone(),
                expected[2].clone(),
                expected[3].clone(),
                Expected::of::<OrgUpdate>(3, 10),
            ],
            "row 5 is missing",
        ),
        (&swapped, "row 1 (message 1) differs"),
        (&wrong_payload, "row 2 (message 2) differs"),
        (&local, "row 4 (message 4) differs"),
    ];
    for (case, difference) in cases {
        let message = panic_message(assert_pending(&db.store, case)).await;
        assert!(
            message.starts_with(&format!(
                "expected exactly {} pending outbox(es), in write order:\n  1. {}\n",
                case.len(),
                case[0]
            )),
            "{message}"
        );
        assert!(
            message.contains(&format!("\n{difference}; found 4 pending:\n")),
            "{difference}: {message}"
        );
        assert!(
            message.contains(" eu "),
            "the table shows every row: {message}"
        );
    }
    let message = panic_message(assert_pending(&Db::new().await.store, &expected[..1])).await;
    assert!(
        message.contains("\nrow 1 is missing; found 0 pending:\n"),
        "{message}"
    );
    assert_pending(&Db::new().await.store, &[]).await;
}

/// A row of a category this binary does not know still shows (by id), and the shard it
/// parks is listed.
#[tokio::test]
async fn unknown_categories_and_parked_shards_show() {
    let db = Db::new().await;
    db.write(&[note::<FutureCategory>(1, 1, 1)]).await;
    let relay = db.relay(
        Recording::<OrgUpdate>::new()
            .register(Registry::builder())
            .build()
            .unwrap(),
    );
    relay.drain().await.unwrap();
    let pending = Pending::of_relay(&relay).await;
    assert_eq!(pending.failing_shards()[0].shard, org_shard(1));
    let message = sync_panic_message(|| pending.assert_empty());
    assert!(message.contains("  #99 "), "{message}");
    assert!(
        message.contains("scope 1 shard 1: parked on unknown category #99"),
        "{message}"
    );
}
