//! What the service declares: two scopes and five categories, two of which are replicated
//! models. Shared by both backends.

use outbox::{outbox_category, outbox_scope, replicated_model};
use serde::{Deserialize, Serialize};

/// Messages about one organization are delivered in order, one at a time.
#[outbox_scope(id = 1)]
pub(crate) struct Organization;

/// Messages about one user are delivered in order, one at a time.
#[outbox_scope(id = 2)]
pub(crate) struct User;

/// "Organization `object_identifier` was renamed": coalescing, so three renames before the
/// relay runs are one delivery of the newest name.
#[outbox_category(scope = Organization, id = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OrganizationRenamed {
    /// The new name.
    pub(crate) name: String,
}

/// An entry of an organization's audit log. Event-style (`coalesce = false`): every event is
/// delivered, in the order written; its object identifier is the event's id.
#[outbox_category(scope = Organization, id = 2, coalesce = false)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AuditLogEvent {
    /// The user who acted.
    pub(crate) actor_user_id: i64,
    /// What they did.
    pub(crate) action: String,
}

/// "User `object_identifier` changed their email address": coalescing.
#[outbox_category(scope = User, id = 3)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UserEmailChanged {
    /// The new address.
    pub(crate) email: String,
}

/// What the deletion handler of a project needs once the project's row is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProjectTombstone {
    /// The project's name when it was last written.
    pub(crate) name: String,
}

impl From<&Project> for ProjectTombstone {
    fn from(project: &Project) -> Self {
        Self {
            name: project.name.clone(),
        }
    }
}

/// A project, kept in a region database and replicated to the control database: a *local*
/// replicated model. One category covers its creation, updates and deletion; at delivery the
/// relay reads the row, and calls the replication handler if it is there, the deletion
/// handler if it is gone.
#[replicated_model(
    scope = Organization,
    id = 4,
    table = "projects",
    shard = organization_id,
    tombstone = ProjectTombstone
)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Project {
    /// The primary key: the object identifier.
    pub(crate) id: i64,
    /// The shard identifier: one organization's projects arrive in order.
    pub(crate) organization_id: i64,
    /// The project's name.
    pub(crate) name: String,
}

/// What the deletion handler of a member needs once the member's row is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemberTombstone {
    /// The user who was a member.
    pub(crate) user_id: i64,
}

impl From<&OrganizationMember> for MemberTombstone {
    fn from(member: &OrganizationMember) -> Self {
        Self {
            user_id: member.user_id,
        }
    }
}

/// A user's membership of an organization, kept in the control database and replicated to
/// the regions each write names: a *fan-out* replicated model. Each destination (region) is
/// a shard of its own, drained independently of the others.
#[replicated_model(
    scope = Organization,
    id = 5,
    table = "organization_members",
    shard = organization_id,
    tombstone = MemberTombstone,
    fan_out
)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OrganizationMember {
    /// The primary key: the object identifier.
    pub(crate) id: i64,
    /// The shard identifier.
    pub(crate) organization_id: i64,
    /// The member.
    pub(crate) user_id: i64,
    /// Their role in the organization.
    pub(crate) role: String,
}
