//! `docs/writing.md`: declaring, writing, handling.

use outbox::{outbox_categories, outbox_category, outbox_handler, outbox_scope, replicated_model};
use outbox::{BoxError, Deletion, Delivery, Message, Registry, Relay, Replication, State};
use outbox::shutdown_signal; // resolves on SIGTERM or Ctrl-C

// A scope shards messages: one organization's messages are delivered in order.
#[outbox_scope(id = 1)]
struct Organization;

// A category is declared on its payload: its scope, its stable id (unique in the crate, or it
// does not compile), and whether it coalesces (`coalesce = false`: every message, in order).
#[outbox_category(scope = Organization, id = 2, coalesce = false)]
#[derive(serde::Serialize, serde::Deserialize)]
struct AuditLogEvent { actor: i64, action: String }

// A replicated model is its own category, covering its creation, updates and deletion.
#[replicated_model(scope = Organization, id = 3, table = "projects", shard = organization_id)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Project { id: i64, organization_id: i64, name: String }

// Handlers are async fns; their first argument says what they handle, the others what they
// need (`State<T>`: a value given to the registry, checked at start-up).
#[outbox_handler]
async fn record_audit(event: Delivery<AuditLogEvent>) -> Result<(), BoxError> {
    audit_log(event.shard_identifier(), event.payload).await // Err(_): the shard backs off, retries
}

#[outbox_handler] // the project's row exists at delivery: here it is, as it is now
async fn replicate_project(
    replication: Replication<Project>,
    State(control): State<ControlPool>,
) -> Result<(), BoxError> {
    upsert_in_control(&control, &replication.object).await
}

#[outbox_handler] // the row is gone: its id, shard, and the tombstone its last write saved
async fn delete_project(deletion: Deletion<Project>) -> Result<(), BoxError> {
    delete_in_control(deletion.key()?).await // the key, as Project's key field has it
}

#[derive(Clone)]
struct ControlPool;

async fn audit_log<S>(_shard: S, _event: AuditLogEvent) -> Result<(), BoxError> {
    Ok(())
}

async fn upsert_in_control(_control: &ControlPool, _project: &Project) -> Result<(), BoxError> {
    Ok(())
}

async fn delete_in_control<K>(_key: K) -> Result<(), BoxError> {
    Ok(())
}

/// The tour's statements, in a service's function.
async fn tour(
    pool: sqlx::PgPool,
    control: ControlPool,
    project: Project,
    org_id: i64,
    event_id: i64,
    event: AuditLogEvent,
) -> Result<(), BoxError> {
    // Write in the transaction that changes the data: a model's row and its outbox together (one
    // statement per table, however many models), or a message of a plain category. Its commit
    // wakes the relays (`outbox::postgres::save(&mut tx, ..)` and `write(&mut *tx, ..)` do the same
    // in a plain sqlx transaction, or on &pool, &mut conn; the relays then find them by polling).
    let mut tx = outbox::postgres::begin(&pool).await?;
    tx.save(&project).await?;  // also insert, update, delete
    tx.write(&Message::new::<AuditLogEvent>(org_id, event_id, &event)?).await?;
    tx.commit().await?;

    // Deliver: every declaration in the binary, checked at start-up (a category without a
    // handler, or declared twice across crates, is refused with both source locations; a handler
    // taking a state not given, naming both).
    let registry = Registry::builder().discovered().state(control).build()?; // or Registry::discover()
    let relay = Relay::new(outbox::postgres::PgStore::new(pool.clone()), registry);
    relay.run(shutdown_signal()).await?;  // until SIGTERM/Ctrl-C; or relay.drain().await? in tests: until nothing is due
    Ok(())
}

// Many categories in one enum.

#[derive(serde::Serialize, serde::Deserialize)]
struct Renamed {
    name: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MemberAdded {
    user: i64,
}

async fn rename<O>(_organization: O, _renamed: Renamed) -> Result<(), BoxError> {
    Ok(())
}

async fn add_member(_added: MemberAdded) -> Result<(), BoxError> {
    Ok(())
}

#[outbox_categories(scope = Organization)]
enum OrgEvent {
    #[category(id = 4)]
    Renamed(Renamed),                                   // name: "renamed"
    #[category(id = 5, name = "member_added", coalesce = false)]
    MemberAdded(MemberAdded),
}

#[outbox_handler] // every category of the enum, in each shard's order
async fn on_organization(event: Delivery<OrgEvent>) -> Result<(), BoxError> {
    match event.payload {
        OrgEvent::Renamed(renamed) => rename(event.object_identifier, renamed).await,
        OrgEvent::MemberAdded(added) => add_member(added).await,
    }
}
