//! The handlers of the five categories, declared with `#[outbox_handler]` and found by
//! `Registry::builder().discovered()`. Shared by both backends: what they need (the control
//! database, the record of deliveries) comes from the registry's state, [`Shared`].

use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{BoxError, Deletion, Delivery, HandlerContext, Replication, outbox_handler};

use crate::backend::{Database, Value};
use crate::declarations::{
    AuditLogEvent, OrganizationMember, OrganizationRenamed, Project, UserEmailChanged,
};

/// What every handler is given, through `Registry::builder().state(shared)` and
/// `cx.state::<Shared>()`.
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

/// The state given to the registry.
fn shared<'a>(cx: &'a HandlerContext<'_>) -> Result<&'a Shared, BoxError> {
    Ok(cx
        .state::<Shared>()
        .ok_or("the registry was built without the Shared state")?)
}

/// A renamed organization: in a real service, the new name goes to the control database's
/// organization directory.
#[outbox_handler]
async fn organization_renamed(
    delivery: Delivery<OrganizationRenamed>,
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    shared(cx)?.delivered.record(format!(
        "organization {} is now called {:?}",
        delivery.object_identifier, delivery.payload.name
    ));
    Ok(())
}

/// An audit log event: every one arrives, in order.
#[outbox_handler]
async fn audit_log_event(
    delivery: Delivery<AuditLogEvent>,
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    shared(cx)?.delivered.record(format!(
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
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    shared(cx)?.delivered.record(format!(
        "user {}'s email is now {:?}",
        delivery.object_identifier, delivery.payload.email
    ));
    Ok(())
}

/// A project that exists in its region at delivery: copied, as it is now, to control.
#[outbox_handler]
async fn replicate_project(
    replication: Replication<Project>,
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    let shared = shared(cx)?;
    let project = &replication.object;
    shared
        .control
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
    shared.delivered.record(format!(
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
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    let shared = shared(cx)?;
    shared
        .control
        .execute(
            "DELETE FROM projects WHERE id = $1",
            &[Value::Int(deletion.object_identifier)],
        )
        .await?;
    shared.delivered.record(format!(
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
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    let region = replication
        .destination()
        .ok_or("a fan-out delivery without a destination")?;
    let member = &replication.object;
    shared(cx)?.delivered.record(format!(
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
    cx: &mut HandlerContext<'_>,
) -> Result<(), BoxError> {
    let region = deletion
        .destination()
        .ok_or("a fan-out delivery without a destination")?;
    shared(cx)?.delivered.record(format!(
        "member {} (user {}) of organization {} is gone: removed from region {region}",
        deletion.object_identifier,
        deletion.payload.user_id,
        deletion.shard_identifier()
    ));
    Ok(())
}
