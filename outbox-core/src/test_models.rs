//! A scope and a replicated model, its traits written by hand, for the crate's own tests.

use crate::model::{Category, CategoryId, Scope, ScopeId};
use crate::replicated::{LocalModel, ModelTable, ReplicatedModel};

/// A scope.
pub(crate) struct Org;

impl Scope for Org {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "org";
}

/// A local replicated model of one column, at replication version 2.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Thing {
    pub(crate) id: i64,
}

impl Category for Thing {
    type Scope = Org;
    type Payload = ();
    const ID: CategoryId = CategoryId(30);
    const NAME: &'static str = "thing";
}

impl ReplicatedModel for Thing {
    const TABLE: ModelTable = ModelTable {
        table: "things",
        key: "id",
        columns: &["id"],
    };
    type Key = i64;

    fn object_identifier(&self) -> crate::Id {
        crate::Id::integer(self.id)
    }

    fn shard_identifier(&self) -> crate::Id {
        crate::Id::integer(1)
    }

    fn tombstone(&self) {}

    const REPLICATION_VERSION: u32 = 2;
}

impl LocalModel for Thing {}
