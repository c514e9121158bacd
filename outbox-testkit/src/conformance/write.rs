//! The write path.

use outbox_core::{
    Category, CategoryId, DeliveryError, Destination, Error, Id, Message, Relay, Scope,
};

use outbox_core::model::RawMessage;
use std::time::Duration;

use serde_json::json;

use super::{assert_in, config, pending, pending_ids, state_of, write};
use crate::backend::{StoreBackend, TestBackend};
use crate::fixtures::{
    AuditEvent, OrgScope, OrgUpdate, Recorder, UserScope, UserUpdate, note, user_shard,
};

/// An outbox written in the caller's transaction commits or rolls back with the business
/// data; rolled back, there is no row, no delivery and no handler call.
pub async fn s01_writes_commit_and_roll_back_with_the_transaction<B: TestBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s01"));
    let messages = [note::<OrgUpdate>(1, 10, 1), note::<AuditEvent>(1, 11, 2)];

    backend
        .write_in_transaction(1, &messages, false)
        .await
        .expect("write, then roll back");
    assert!(
        !backend.business_row_exists(1).await,
        "the business row was rolled back"
    );
    assert!(
        pending(&backend).await.is_empty(),
        "rolled-back outboxes left rows"
    );
    let report = relay.drain().await.expect("drain");
    assert_eq!(report.deliveries, 0);
    assert!(
        recorder.seen().is_empty(),
        "a rolled-back outbox reached a handler"
    );

    backend
        .write_in_transaction(2, &messages, true)
        .await
        .expect("write, then commit");
    assert!(backend.business_row_exists(2).await);
    assert_eq!(
        pending(&backend).await.len(),
        2,
        "committed outboxes are pending"
    );
    relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [("org_update", 10, 1), ("audit_event", 11, 2)]
    );
    assert!(pending(&backend).await.is_empty());
}

/// The typed API takes the scope from the category; an untyped message whose scope is not
/// its category's, or whose category is unknown, is refused before reaching the database.
pub async fn s04_scope_mismatch_is_rejected_before_the_database<B: StoreBackend>() {
    let backend = B::create().await;
    let registry = Recorder::new().registry();

    let typed = note::<UserUpdate>(7, 7, 1);
    assert_eq!(
        typed.shard().scope,
        UserScope::ID,
        "the typed API derives the scope"
    );

    let raw = RawMessage {
        scope: UserScope::ID,
        shard_identifier: Id::integer(7),
        destination: None,
        category: OrgUpdate::ID,
        object_identifier: Id::integer(7),
        payload: json!({ "seq": 1, "text": "wrong scope" }),
    };
    let error = Message::from_raw(raw.clone(), &registry).expect_err("wrong scope is refused");
    assert!(
        matches!(
            error,
            Error::ScopeMismatch { category: "org_update", expected, found, .. }
                if expected == OrgScope::ID && found == UserScope::ID
        ),
        "unexpected error: {error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("org_update") && text.contains("scope 1") && text.contains("scope 2"),
        "the message names the category and both scopes: {text}"
    );

    let unknown = RawMessage {
        category: CategoryId(4242),
        ..raw.clone()
    };
    let error = Message::from_raw(unknown, &registry).expect_err("unknown category is refused");
    assert!(matches!(
        error,
        Error::UnknownCategory {
            category: CategoryId(4242)
        }
    ));
    assert!(error.to_string().contains("4242"));

    let valid = RawMessage {
        scope: OrgScope::ID,
        ..raw
    };
    let valid = Message::from_raw(valid, &registry).expect("a matching scope is accepted");
    write(&backend, &[valid]).await;
    let rows = pending(&backend).await;
    assert_eq!(rows.len(), 1, "only the valid message was written");
    assert_eq!(rows[0].shard.scope, OrgScope::ID);
}

/// A row whose scope is not its category's (written behind the API's back) is never
/// delivered or deleted: its shard backs off (it is not parked: no binary would know better)
/// with an error naming both scopes and saying so.
pub async fn s04_stored_row_with_a_mismatched_scope_backs_its_shard_off<B: StoreBackend>() {
    let backend = B::create().await;
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("s04"));
    let shard = user_shard(7);

    write(&backend, &[note::<UserUpdate>(7, 1, 1)]).await;
    let bad = backend
        .insert_raw(
            &shard,
            OrgUpdate::ID.0,
            2.into(),
            r#"{"seq":2,"text":"misfiled"}"#,
        )
        .await;

    let report = relay.drain().await.expect("drain");
    assert_eq!(
        recorder.triples(),
        [("user_update", 1, 1)],
        "rows before it are delivered"
    );
    assert_eq!(report.failures.len(), 1);
    assert!(matches!(
        &report.failures[0].error,
        DeliveryError::ScopeMismatch { message_id, category: "org_update", .. } if *message_id == bad
    ));
    assert_eq!(pending_ids(&backend).await, [bad], "the row is kept");
    let state = state_of(&backend.store(), &shard)
        .await
        .expect("the shard has state");
    let error = state.last_error.expect("the error is recorded");
    assert!(
        error.contains("scope 2") && error.contains("org_update"),
        "{error}"
    );
    assert!(
        error.contains("backs off") && !error.contains("parked"),
        "the error says what happens: {error}"
    );
    assert_eq!(state.parked_category, None, "the shard is not parked");
    assert_in(state.retry_at, Duration::from_secs(2), "the shard's retry");
}

/// A bulk write inserts every row with one statement.
pub async fn s05_bulk_write_is_one_statement<B: TestBackend>() {
    let backend = B::create().await;
    let us = Destination::new("us").expect("a destination");
    let mut messages: Vec<Message> = (0..240)
        .map(|i| note::<AuditEvent>(i % 12, i, u64::try_from(i).expect("small")))
        .collect();
    messages.extend(
        Message::fan_out::<OrgUpdate>([us.clone()], 3, 1000, &crate::fixtures::Note::new(1000))
            .expect("fan out"),
    );

    let (ids, statements) = backend
        .write_all_counted(&messages)
        .await
        .expect("bulk write");
    assert_eq!(
        statements,
        1,
        "{} rows took {statements} statements",
        messages.len()
    );
    assert_eq!(ids.len(), messages.len());
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "ids ascend");

    let rows = pending(&backend).await;
    assert_eq!(rows.len(), messages.len());
    let fanned = rows.last().expect("rows");
    assert_eq!(fanned.shard.destination, Some(us));
    assert_eq!(fanned.payload_value()["seq"], 1000);
    assert_eq!(
        rows[5].payload_value()["seq"],
        5,
        "payloads are kept in order"
    );
    assert_eq!(rows[5].category, AuditEvent::ID);
    assert_eq!(rows[5].shard.scope, <AuditEvent as Category>::Scope::ID);

    let (ids, statements) = backend
        .write_all_counted(&[])
        .await
        .expect("empty bulk write");
    assert!(ids.is_empty());
    assert_eq!(statements, 0, "an empty bulk write runs nothing");
}
