//! The declaration macros' expansions are lint-clean in a user's crate: every macro with every
//! option, in a crate that denies warnings, `clippy::all`, `clippy::pedantic`, missing docs,
//! the 2018 idioms and unused qualifications (CI runs clippy on every target with
//! `-D warnings`, so this file is linted there too).
//!
//! The names the expansions spell as `::outbox_core::...` are imported here as a user would,
//! so that an expansion qualifying a name the user already has in scope would show up as
//! `unused_qualifications`.

#![deny(
    warnings,
    clippy::all,
    clippy::pedantic,
    missing_docs,
    rust_2018_idioms,
    unused_qualifications
)]

use std::sync::{Mutex, PoisonError};

use outbox_core::{
    BoxError, Category, CategoryId, Deletion, Delivery, FanOutModel, LocalModel, Registry,
    ReplicatedModel, Replication, Scope, ScopeId, State, outbox_categories, outbox_category,
    outbox_handler, outbox_scope, replicated_model,
};

use outbox_core::replicated::ModelTable;
use serde::{Deserialize, Serialize};

/// What the handlers saw.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn see(line: String) {
    SEEN.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line);
}

/// The organizations: the scope of most categories.
#[outbox_scope(id = 1)]
pub struct Organization;

/// The audit log, under a name of its own.
#[outbox_scope(id = 20_000, name = "audit")]
pub struct AuditLog;

/// A coalescing category: only the newest update of a project is delivered.
#[outbox_category(scope = Organization, id = 100_000)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProjectUpdate {
    /// The project's new name.
    pub name: String,
}

/// A team was renamed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TeamRenamed {
    /// The new name.
    pub name: String,
}

/// A team was archived.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TeamArchived;

/// The team categories, declared together.
#[outbox_categories(scope = Organization)]
#[derive(Debug)]
pub enum TeamEvent {
    /// A rename.
    #[category(id = 20)]
    Renamed(TeamRenamed),
    /// An archival, every one delivered.
    #[category(id = 21, name = "team.archived", coalesce = false)]
    Archived(TeamArchived),
}

impl TeamEvent {
    /// The ids of the enum's categories.
    fn categories() -> [CategoryId; 2] {
        [
            <TeamRenamed as Category>::ID,
            <TeamArchived as Category>::ID,
        ]
    }
}

/// Handles every team event.
///
/// # Errors
///
/// Never.
#[outbox_handler]
pub async fn team_event(event: Delivery<TeamEvent>) -> Result<(), BoxError> {
    match event.payload {
        TeamEvent::Renamed(renamed) => see(renamed.name),
        TeamEvent::Archived(TeamArchived) => see("archived".to_owned()),
    }
    tokio::task::yield_now().await;
    Ok(())
}

/// An event-style category with its own name: every entry is delivered, in order.
#[outbox_category(scope = AuditLog, id = 2, name = "audit.entry", coalesce = false)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntry {
    /// What was done.
    pub action: String,
}

/// A category that needs no handler.
#[outbox_category(scope = Organization, id = 3, no_op)]
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CacheHint;

/// A private category, declared on an enum.
#[outbox_category(scope = Organization, id = 4, coalesce = true)]
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Ping {
    Once,
    Twice(u8),
}

/// A local replicated model with the default key and tombstone.
#[replicated_model(scope = Organization, id = 10, table = "projects", shard = organization_id)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Project {
    /// The primary key.
    pub id: i64,
    /// The shard.
    pub organization_id: i64,
    /// The name.
    pub name: String,
    /// Whether it is archived.
    pub archived: bool,
    /// Whether it is hidden, if known.
    pub hidden: Option<bool>,
}

/// What a member's deletion handler needs once the row is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberTombstone {
    /// The member's address.
    pub email: String,
}

impl From<&Member> for MemberTombstone {
    fn from(member: &Member) -> Self {
        Self {
            email: member.email.clone(),
        }
    }
}

/// A fan-out replicated model with its own key, tombstone and schema-qualified table.
#[replicated_model(
    scope = Organization,
    id = 11,
    name = "member",
    table = "app.members",
    shard = org,
    key = member_id,
    tombstone = MemberTombstone,
    fan_out
)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The primary key.
    pub member_id: u32,
    /// The shard.
    pub org: i32,
    /// The address.
    pub email: String,
    /// A field named with a keyword.
    pub r#type: String,
}

/// Handles project updates, with a state.
///
/// # Errors
///
/// Never, but the type says it could.
#[outbox_handler]
pub async fn project_updated(
    delivery: Delivery<ProjectUpdate>,
    State(prefix): State<String>,
) -> Result<(), BoxError> {
    see(format!("{prefix} {}", delivery.payload.name));
    tokio::task::yield_now().await;
    Ok(())
}

/// Records audit entries, without the context.
///
/// # Errors
///
/// Never, but the type says it could.
#[outbox_handler]
pub async fn audited(delivery: Delivery<AuditEntry>) -> Result<(), std::io::Error> {
    // No `.await`: a handler is async because handlers are, and `clippy::unused_async` knows.
    see(delivery.payload.action);
    Ok(())
}

// Named like the expansion's own parameters: they cannot shadow it.
#[outbox_handler]
async fn delivery(delivery: Delivery<Ping>) -> Result<(), BoxError> {
    see(format!("{:?}", delivery.payload));
    tokio::task::yield_now().await;
    Ok(())
}

/// Replicates projects, without the context.
///
/// # Errors
///
/// Never.
#[outbox_handler]
pub async fn replicate_project(replication: Replication<Project>) -> Result<(), BoxError> {
    see(format!("replicate {}", replication.object.name));
    tokio::task::yield_now().await;
    Ok(())
}

#[outbox_handler]
async fn cx(deletion: Deletion<Project>, cx: State<String>) -> Result<(), BoxError> {
    let _ = cx;
    see(format!("delete {}", deletion.object_identifier));
    tokio::task::yield_now().await;
    Ok(())
}

#[outbox_handler]
async fn replicate_member(
    replication: Replication<Member>,
    requirements: State<String>,
) -> Result<(), BoxError> {
    let _ = requirements;
    see(format!("replicate {}", replication.object.email));
    tokio::task::yield_now().await;
    Ok(())
}

/// Deletes members, without the context.
///
/// # Errors
///
/// Never.
#[outbox_handler]
pub async fn delete_member(deletion: Deletion<Member>) -> Result<(), BoxError> {
    see(format!("delete {}", deletion.payload.email));
    tokio::task::yield_now().await;
    Ok(())
}

fn local<M: ReplicatedModel + LocalModel>() -> ModelTable {
    M::TABLE
}

fn fan_out<M: ReplicatedModel + FanOutModel>() -> ModelTable {
    M::TABLE
}

#[test]
fn declarations_in_a_function_body_are_lint_clean() {
    #[outbox_scope(id = 9, name = "in_a_function")]
    struct InAFunction;

    assert_eq!(InAFunction::ID, ScopeId(9));
}

/// Everything declared here, with the `String` the handlers take.
fn registry() -> Registry {
    Registry::builder()
        .discovered()
        .state(String::from("prefix"))
        .build()
        .expect("the declarations are consistent")
}

#[test]
fn the_declarations_are_discovered() {
    let registry = registry();
    let categories: Vec<_> = registry
        .categories()
        .iter()
        // The category enum's, checked by `the_category_enum_is_discovered`.
        .filter(|info| !TeamEvent::categories().contains(&info.identity.id))
        .map(|info| {
            (
                info.identity.id,
                info.identity.name,
                info.identity.scope,
                info.identity.scope_name,
                info.identity.coalesce,
                info.no_op,
                info.model,
            )
        })
        .collect();
    let organization = (Organization::ID, Organization::NAME);
    assert_eq!(
        categories,
        [
            (
                CategoryId(2),
                "audit.entry",
                ScopeId(20_000),
                "audit",
                false,
                false,
                None
            ),
            (
                CategoryId(3),
                "cache_hint",
                organization.0,
                organization.1,
                true,
                true,
                None
            ),
            (
                CategoryId(4),
                "ping",
                organization.0,
                organization.1,
                true,
                false,
                None
            ),
            (
                CategoryId(10),
                "project",
                organization.0,
                organization.1,
                true,
                false,
                Some(local::<Project>())
            ),
            (
                CategoryId(11),
                "member",
                organization.0,
                organization.1,
                true,
                false,
                Some(fan_out::<Member>())
            ),
            (
                CategoryId(100_000),
                "project_update",
                organization.0,
                organization.1,
                true,
                false,
                None
            ),
        ]
    );
    assert_eq!(AuditLog::NAME, "audit");
    assert_eq!(<Ping as Category>::ID, CategoryId(4));
    let member = Member {
        member_id: 5,
        org: 9,
        email: "ada@example.com".into(),
        r#type: "admin".into(),
    };
    assert_eq!(
        (member.object_identifier(), member.shard_identifier()),
        (outbox_core::Id::integer(5), outbox_core::Id::integer(9))
    );
    assert_eq!(member.tombstone().email, "ada@example.com");
    assert_eq!(Member::TABLE.columns, ["member_id", "org", "email", "type"]);
    let _ = (Ping::Once, Ping::Twice(2), CacheHint);
    assert!(
        SEEN.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    );
}

#[test]
fn the_category_enum_is_discovered() {
    let registry = registry();
    let categories: Vec<_> = TeamEvent::categories()
        .iter()
        .map(|id| {
            let info = registry.category(*id).expect("declared");
            (
                info.identity.id.0,
                info.identity.name,
                info.identity.scope_name,
                info.identity.coalesce,
            )
        })
        .collect();
    assert_eq!(
        categories,
        [
            (20, "renamed", Organization::NAME, true),
            (21, "team.archived", Organization::NAME, false)
        ]
    );
}
