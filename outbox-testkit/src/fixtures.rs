//! A small domain for tests: two scopes, four categories, and a recording handler.

use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{
    BoxError, Category, CategoryId, Delivery, Handler, Message, Registry, RegistryBuilder, Scope,
    ScopeId, ShardKey,
};
use serde::{Deserialize, Serialize};

/// Organizations: the scope of most test categories.
#[derive(Debug)]
pub struct OrgScope;
impl Scope for OrgScope {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "organization";
}

/// Users: a second scope.
#[derive(Debug)]
pub struct UserScope;
impl Scope for UserScope {
    const ID: ScopeId = ScopeId(2);
    const NAME: &'static str = "user";
}

/// The payload of every test category: a sequence number and a note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    /// Increases with each write in a test, so order and coalescing are visible.
    pub seq: u64,
    /// Free text.
    pub text: String,
}

impl Note {
    /// A note with sequence number `seq`.
    pub fn new(seq: u64) -> Self {
        Self {
            seq,
            text: format!("note {seq}"),
        }
    }
}

/// A coalescing category of the organization scope.
#[derive(Debug)]
pub struct OrgUpdate;
impl Category for OrgUpdate {
    type Scope = OrgScope;
    type Payload = Note;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "org_update";
}

/// A second coalescing category of the organization scope.
#[derive(Debug)]
pub struct ProjectUpdate;
impl Category for ProjectUpdate {
    type Scope = OrgScope;
    type Payload = Note;
    const ID: CategoryId = CategoryId(2);
    const NAME: &'static str = "project_update";
}

/// A non-coalescing (event) category of the organization scope.
#[derive(Debug)]
pub struct AuditEvent;
impl Category for AuditEvent {
    type Scope = OrgScope;
    type Payload = Note;
    const ID: CategoryId = CategoryId(3);
    const NAME: &'static str = "audit_event";
    const COALESCE: bool = false;
}

/// A coalescing category of the user scope.
#[derive(Debug)]
pub struct UserUpdate;
impl Category for UserUpdate {
    type Scope = UserScope;
    type Payload = Note;
    const ID: CategoryId = CategoryId(4);
    const NAME: &'static str = "user_update";
}

/// A category that only a "newer binary" knows (for unknown-category tests).
#[derive(Debug)]
pub struct FutureCategory;
impl Category for FutureCategory {
    type Scope = OrgScope;
    type Payload = Note;
    const ID: CategoryId = CategoryId(99);
    const NAME: &'static str = "future_category";
}

/// A message of category `C` with payload `Note::new(seq)`.
pub fn note<C: Category<Payload = Note>>(shard: i64, object: i64, seq: u64) -> Message {
    Message::new::<C>(shard, object, &Note::new(seq)).expect("a note serializes")
}

/// One delivery a [`Recorder`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The category's name.
    pub category: &'static str,
    /// The shard.
    pub shard: ShardKey,
    /// The object.
    pub object: i64,
    /// The delivered payload's sequence number.
    pub seq: u64,
    /// The fencing token of the lease.
    pub token: i64,
    /// The attempt number.
    pub attempt: u32,
}

/// Records every delivery it handles, in order, across threads.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a delivery.
    pub fn record<C: Category<Payload = Note>>(&self, delivery: &Delivery<C>) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                category: C::NAME,
                shard: delivery.shard.clone(),
                object: delivery.object_identifier,
                seq: delivery.payload.seq,
                token: delivery.fencing_token,
                attempt: delivery.attempt,
            });
    }

    /// Everything recorded so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `(category, object, seq)` of everything recorded so far.
    pub fn triples(&self) -> Vec<(&'static str, i64, u64)> {
        self.seen()
            .into_iter()
            .map(|seen| (seen.category, seen.object, seen.seq))
            .collect()
    }

    /// The deliveries of one shard, in order.
    pub fn in_shard(&self, shard: &ShardKey) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|seen| &seen.shard == shard)
            .collect()
    }

    /// A handler that records and succeeds.
    pub fn handler<C: Category<Payload = Note>>(&self) -> impl Handler<C> {
        let recorder = self.clone();
        move |delivery: Delivery<C>| {
            recorder.record(&delivery);
            async { Ok::<_, BoxError>(()) }
        }
    }

    /// A registry of the four test categories, each recorded by this recorder.
    pub fn registry(&self) -> Registry {
        self.builder()
            .build()
            .expect("the test categories do not conflict")
    }

    /// A registry where category `C` has `handler`, and the other test categories are
    /// recorded by this recorder.
    pub fn registry_with<C: Category>(&self, handler: impl Handler<C>) -> Registry {
        let mut builder = Registry::builder().handle::<C>(handler);
        if C::ID != OrgUpdate::ID {
            builder = builder.handle::<OrgUpdate>(self.handler());
        }
        if C::ID != ProjectUpdate::ID {
            builder = builder.handle::<ProjectUpdate>(self.handler());
        }
        if C::ID != AuditEvent::ID {
            builder = builder.handle::<AuditEvent>(self.handler());
        }
        if C::ID != UserUpdate::ID {
            builder = builder.handle::<UserUpdate>(self.handler());
        }
        builder
            .build()
            .expect("the test categories do not conflict")
    }

    /// [`Recorder::registry`]'s builder, to add categories.
    pub fn builder(&self) -> RegistryBuilder {
        Registry::builder()
            .handle::<OrgUpdate>(self.handler())
            .handle::<ProjectUpdate>(self.handler())
            .handle::<AuditEvent>(self.handler())
            .handle::<UserUpdate>(self.handler())
    }
}

/// The local shard `shard` of the organization scope.
pub fn org_shard(shard: i64) -> ShardKey {
    ShardKey::local(OrgScope::ID, shard)
}
