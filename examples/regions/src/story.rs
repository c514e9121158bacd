//! What the service does, written once for both backends: changes in a region database and in
//! the control database, each with its outbox messages in the same transaction, then one relay
//! per database delivering them.

use outbox::{BoxError, Destination, Message, ModelBatch, Registry, RelayConfig};

use crate::backend::{Backend, Database, Value};
use crate::declarations::{
    AuditLogEvent, OrganizationMember, OrganizationRenamed, Project, UserEmailChanged,
};
use crate::handlers::{Deliveries, Shared};

/// The tables of a region database: the organizations and projects hosted in the region.
const REGION_SCHEMA: [&str; 2] = [
    "CREATE TABLE organizations (id BIGINT PRIMARY KEY, name TEXT NOT NULL)",
    "CREATE TABLE projects (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, \
     name TEXT NOT NULL)",
];

/// The tables of the control database: users, memberships, and the copy of every region's
/// projects.
const CONTROL_SCHEMA: [&str; 3] = [
    "CREATE TABLE users (id BIGINT PRIMARY KEY, email TEXT NOT NULL)",
    "CREATE TABLE organization_members (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, \
     user_id BIGINT NOT NULL, role TEXT NOT NULL)",
    "CREATE TABLE projects (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, \
     name TEXT NOT NULL)",
];

/// The state before the story starts, already in sync (written without outboxes): organization
/// 1 with project 11 in the region, copied to control; users 7 and 8, 8 a member of
/// organization 1.
const REGION_SEED: [&str; 2] = [
    "INSERT INTO organizations (id, name) VALUES (1, 'Acme')",
    "INSERT INTO projects (id, organization_id, name) VALUES (11, 1, 'legacy')",
];

/// See [`REGION_SEED`].
const CONTROL_SEED: [&str; 3] = [
    "INSERT INTO users (id, email) VALUES (7, 'ada@example.com'), (8, 'bob@example.com')",
    "INSERT INTO organization_members (id, organization_id, user_id, role) \
     VALUES (101, 1, 8, 'member')",
    "INSERT INTO projects (id, organization_id, name) VALUES (11, 1, 'legacy')",
];

/// Reads the control database's copy of the projects.
const CONTROL_PROJECTS: &str = "SELECT id, organization_id, name FROM projects ORDER BY id";

/// The organization of the story.
const ACME: i64 = 1;
/// The user who acts.
const ADA: i64 = 7;

/// What the story did, for the caller to check.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// One line per handler call, in order.
    pub(crate) delivered: Vec<String>,
    /// `(id, organization, name)` of the projects in the control database, at the end.
    pub(crate) control_projects: Vec<(i64, i64, String)>,
}

/// Runs the story on `backend`, and removes its databases afterwards, whether it succeeded or
/// not.
pub(crate) async fn run(mut backend: Backend) -> Result<Outcome, BoxError> {
    println!("regions: on {}", backend.describe());
    let mut databases = Vec::new();
    let outcome = async {
        let region = backend.create_database("region").await?;
        databases.push(region.clone());
        let control = backend.create_database("control").await?;
        databases.push(control.clone());
        tell(&region, &control).await
    }
    .await;
    backend.remove(databases).await?;
    outcome
}

/// The story itself, on a region database (the `us` region, say) and the control database.
async fn tell(region: &Database, control: &Database) -> Result<Outcome, BoxError> {
    for statement in REGION_SCHEMA.into_iter().chain(REGION_SEED) {
        region.execute(statement, &[]).await?;
    }
    for statement in CONTROL_SCHEMA.into_iter().chain(CONTROL_SEED) {
        control.execute(statement, &[]).await?;
    }
    println!("regions: organization 1 \"Acme\" and its project 11 \"legacy\" in the region,");
    println!(
        "         users 7 and 8 (member 101 of organization 1) and a copy of project 11 in control"
    );
    let before: Vec<(i64, i64, String)> = control.fetch_all(CONTROL_PROJECTS).await?;
    println!("control: projects {before:?}");

    // In the region: three renames, each audited; a fourth that rolls back.
    for (event, name) in [(1, "Acme Inc"), (2, "Acme Corp"), (3, "Acme Corporation")] {
        let mut tx = region.begin().await?;
        rename_organization(&mut tx, event, name).await?;
        tx.commit().await?;
        println!("region:  renamed organization 1 to {name:?}, audit event {event}");
    }
    let mut tx = region.begin().await?;
    rename_organization(&mut tx, 4, "Oops").await?;
    tx.rollback().await?;
    println!("region:  renamed organization 1 to \"Oops\" and rolled back: no messages");

    // In the region: project 10 created then renamed, project 11 deleted. The model writes
    // change the rows and write their outboxes in the same transaction.
    let mut website = Project {
        id: 10,
        organization_id: ACME,
        name: "website".into(),
    };
    let mut tx = region.begin().await?;
    tx.insert(&website).await?;
    tx.commit().await?;
    println!("region:  created project 10 \"website\"");
    website.name = "website v2".into();
    let mut tx = region.begin().await?;
    tx.update(&website).await?;
    tx.commit().await?;
    println!("region:  renamed project 10 to \"website v2\"");
    let legacy = Project {
        id: 11,
        organization_id: ACME,
        name: "legacy".into(),
    };
    let mut tx = region.begin().await?;
    tx.delete(&legacy).await?;
    tx.commit().await?;
    println!("region:  deleted project 11");

    // In control: a user changes their email twice.
    for email in ["ada@acme.example", "ada.lovelace@acme.example"] {
        let mut tx = control.begin().await?;
        tx.execute(
            "UPDATE users SET email = $1 WHERE id = $2",
            &[Value::Text(email), Value::Int(ADA)],
        )
        .await?;
        let changed = UserEmailChanged {
            email: email.into(),
        };
        tx.write_all(&[Message::new::<UserEmailChanged>(ADA, ADA, &changed)?])
            .await?;
        tx.commit().await?;
        println!("control: user 7 changed their email to {email:?}");
    }

    // In control: user 7 joins organization 1 and user 8 leaves it, in both regions where
    // organization 1 has data. Each write fans out to one outbox per region.
    let regions = || -> Result<[Destination; 2], BoxError> {
        Ok([Destination::new("us")?, Destination::new("eu")?])
    };
    let joined = OrganizationMember {
        id: 100,
        organization_id: ACME,
        user_id: ADA,
        role: "owner".into(),
    };
    let mut tx = control.begin().await?;
    tx.insert(ModelBatch::to(&joined, regions()?)).await?;
    tx.commit().await?;
    println!("control: added member 100 (user 7, owner) to organization 1, for regions us and eu");
    let left = OrganizationMember {
        id: 101,
        organization_id: ACME,
        user_id: 8,
        role: "member".into(),
    };
    let mut tx = control.begin().await?;
    tx.delete(ModelBatch::to(&left, regions()?)).await?;
    tx.commit().await?;
    println!("control: removed member 101 (user 8) from organization 1, for regions us and eu");

    // The relays: one per database, each with every handler of the binary.
    let delivered = Deliveries::default();
    let shared = Shared {
        control: control.clone(),
        delivered: delivered.clone(),
    };
    deliver("region", region, &shared).await?;
    deliver("control", control, &shared).await?;

    Ok(Outcome {
        delivered: delivered.lines(),
        control_projects: control.fetch_all(CONTROL_PROJECTS).await?,
    })
}

/// Renames organization 1, writing its `OrganizationRenamed` message and an audit log event
/// in the same transaction.
async fn rename_organization(
    tx: &mut crate::backend::Tx,
    event: i64,
    name: &str,
) -> Result<(), BoxError> {
    tx.execute(
        "UPDATE organizations SET name = $1 WHERE id = $2",
        &[Value::Text(name), Value::Int(ACME)],
    )
    .await?;
    let renamed = OrganizationRenamed { name: name.into() };
    let audit = AuditLogEvent {
        actor_user_id: ADA,
        action: format!("renamed the organization to {name:?}"),
    };
    tx.write_all(&[
        Message::new::<OrganizationRenamed>(ACME, ACME, &renamed)?,
        Message::new::<AuditLogEvent>(ACME, event, &audit)?,
    ])
    .await?;
    Ok(())
}

/// Runs a relay on `database`'s outbox until nothing is due, and reports what it did.
async fn deliver(name: &str, database: &Database, shared: &Shared) -> Result<(), BoxError> {
    let pending = database.pending_messages().await?;
    println!("relay:   {name} outbox, {pending} messages pending");
    let registry = Registry::builder()
        .discovered()
        .state(shared.control.clone())
        .state(shared.delivered.clone())
        .build()?;
    // One shard at a time, so that the lines come out in the same order on every run; a
    // service keeps the default and drains shards concurrently.
    let config = RelayConfig::builder().max_concurrent_shards(1).build()?;
    let report = database.drain(registry, config).await?;
    if !report.is_clean() {
        return Err(format!("the {name} relay failed: {report:?}").into());
    }
    let left = database.pending_messages().await?;
    println!(
        "relay:   {name} outbox, {} deliveries for {pending} messages, {left} pending",
        report.deliveries
    );
    Ok(())
}
