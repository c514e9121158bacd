//! The handlers of the five categories, declared with `#[outbox_handler]` and found by
//! `Registry::builder().discovered()`. Shared by both backends: what they need (the control
//! database, the record of deliveries) they take as arguments, `State<Database>` and
//! `State<Deliveries>`: clones of the values given to `Registry::builder().state(..)`, checked
//! when the registry is built.

use std::sync::{Arc, Mutex, PoisonError};

use outbox::{BoxError, Deletion, Delivery, Replication, State, outbox_handler};

use crate::backend::{Database, Value};
use crate::declarations::{
    AuditLogEvent, OrganizationMember, OrganizationRenamed, Project, UserEmailChanged,
};

/// What the handlers are given, each part through `Registry::builder().state(..)` and taken as
/// `State<Database>` or `State<Deliveries>`.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// The control database, where projects are replicated to.
    pub(crate) control: Database,
    /// One line per handler call, in order.
    pub(crate) delivered: Deliveries,
}

/// The handler calls so far, one line each: printed as they happen, and kept for the caller.
#[derive(Debug, Clone, Default)]
pub(crate) struct Deliveries(Arc<Mutex<Vec<String>>>);

impl Deliveries {
    /// Prints and records one handler call.
    fn record(&self, line: String) {
        println!("  delivered: {line}");
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// The lines recorded so far, in order.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A renamed organization: in a real service, the new name goes to the control database's
/// organization directory.
#[outbox_handler]
async fn organization_renamed(
    delivery: Delivery<OrganizationRenamed>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    delivered.record(format!(
        "organization {} is now called {:?}",
        delivery.object_identifier, delivery.payload.name
    ));
    Ok(())
}

/// An audit log event: every one arrives, in order.
#[outbox_handler]
async fn audit_log_event(
    delivery: Delivery<AuditLogEvent>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    delivered.record(format!(
        "audit event {} in organization {}: user {} {}",
        delivery.object_identifier,
        delivery.shard_identifier(),
        delivery.payload.actor_user_id,
        delivery.payload.action
    ));
    Ok(())
}

/// A changed email address: in a real service, a confirmation email.
#[outbox_handler]
async fn user_email_changed(
    delivery: Delivery<UserEmailChanged>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    delivered.record(format!(
        "user {}'s email is now {:?}",
        delivery.object_identifier, delivery.payload.email
    ));
    Ok(())
}

/// A project that exists in its region at delivery: copied, as it is now, to control.
#[outbox_handler]
async fn replicate_project(
    replication: Replication<Project>,
    State(control): State<Database>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    let project = &replication.object;
    control
        .execute(
            "INSERT INTO projects (id, organization_id, name) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE \
             SET organization_id = excluded.organization_id, name = excluded.name",
            &[
                Value::Int(project.id),
                Value::Int(project.organization_id),
                Value::Text(&project.name),
            ],
        )
        .await?;
    delivered.record(format!(
        "project {} {:?} of organization {} copied to control",
        project.id,
        project.name,
        replication.shard_identifier()
    ));
    Ok(())
}

/// A project gone from its region at delivery: its copy is deleted from control. Its
/// tombstone says what it was called.
#[outbox_handler]
async fn delete_project(
    deletion: Deletion<Project>,
    State(control): State<Database>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    control
        .execute(
            "DELETE FROM projects WHERE id = $1",
            &[Value::Int(i64::try_from(deletion.object_identifier)?)],
        )
        .await?;
    delivered.record(format!(
        "project {} {:?} of organization {} is gone: deleted from control",
        deletion.object_identifier,
        deletion.payload.name,
        deletion.shard_identifier()
    ));
    Ok(())
}

/// A membership that exists in control at delivery, for one region: in a real service, written
/// to that region's database.
#[outbox_handler]
async fn replicate_member(
    replication: Replication<OrganizationMember>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    let region = replication
        .destination()
        .ok_or("a fan-out delivery without a destination")?;
    let member = &replication.object;
    delivered.record(format!(
        "member {} (user {}, {}) of organization {} to region {region}",
        member.id,
        member.user_id,
        member.role,
        replication.shard_identifier()
    ));
    Ok(())
}

/// A membership gone from control at delivery, for one region: its tombstone says whose it
/// was.
#[outbox_handler]
async fn delete_member(
    deletion: Deletion<OrganizationMember>,
    State(delivered): State<Deliveries>,
) -> Result<(), BoxError> {
    let region = deletion
        .destination()
        .ok_or("a fan-out delivery without a destination")?;
    delivered.record(format!(
        "member {} (user {}) of organization {} is gone: removed from region {region}",
        deletion.object_identifier,
        deletion.payload.user_id,
        deletion.shard_identifier()
    ));
    Ok(())
}
