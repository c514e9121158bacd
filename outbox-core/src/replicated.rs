//! Replicated models: a domain struct whose every create, update and delete announces itself
//! through one category, delivered to a replication handler while the object exists and to a
//! deletion handler once it is gone (the seeds' `ReplicatedRegionModel` and
//! `ReplicatedControlModel`).

use crate::error::Error;
use crate::id::{Id, Identifier};
use crate::model::{Category, Destination, Message, Payload};

/// Where a replicated model's rows live: what a backend needs to read and write them.
///
/// Columns are named like the model's fields; each holds its field's value, written with the
/// field's own type ([`ModelColumns`](crate::columns::ModelColumns)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelTable {
    /// The table, optionally qualified by its schema (`app.projects`).
    pub table: &'static str,
    /// The column holding the object identifier: the table's primary key.
    pub key: &'static str,
    /// Every column the model maps, the key included, in field order.
    pub columns: &'static [&'static str],
}

impl ModelTable {
    /// The columns an update of a row sets: every column but the key, or the key alone if
    /// it is the only one.
    pub fn updated_columns(&self) -> Vec<&'static str> {
        let others: Vec<_> = self
            .columns
            .iter()
            .copied()
            .filter(|column| *column != self.key)
            .collect();
        if others.is_empty() {
            vec![self.key]
        } else {
            others
        }
    }
}

/// A domain struct replicated through the outbox: declared with `#[replicated_model(...)]`.
///
/// The model is its own [`Category`]: one category covers its creation, updates and deletion.
/// Every write carries the model's [`tombstone`](ReplicatedModel::tombstone) as the
/// category's payload: what the deletion handler needs once the row is gone. At delivery the
/// relay reads the row by its key: present, the [`Replication`](crate::Replication) handler runs with the row as
/// it is now; gone, the [`Deletion`](crate::Deletion) handler runs with the identifiers and the tombstone.
///
/// The backends write models together with their outboxes (`outbox_sqlite::save`,
/// `outbox_postgres::save`, and `insert`, `update`, `delete`), one statement per table
/// however many models there are.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a replicated model",
    label = "not a replicated model",
    note = "declare it with `#[replicated_model(scope = ..., id = ..., table = \"...\", shard = <field>)]`"
)]
pub trait ReplicatedModel: Category + Payload + Sync {
    /// The table the model's rows live in.
    const TABLE: ModelTable;

    /// The type of the key field: what [`Deletion::key`](crate::Deletion::key) gives back.
    type Key: Identifier;

    /// The object identifier: the value of the key column.
    fn object_identifier(&self) -> Id;

    /// The shard identifier: the value of the field the shard key names.
    fn shard_identifier(&self) -> Id;

    /// What the deletion handler will need once the row is gone, saved with every write.
    fn tombstone(&self) -> Self::Payload;

    /// The version of the model's replication logic (`replication_version = N`; 1 by
    /// default). Raising it, then starting a backfill to it, writes an outbox for every row
    /// the table holds (see [`crate::backfill`]).
    const REPLICATION_VERSION: u32 = 1;

    /// Whether the model fans out (`fan_out`): each write names its destinations.
    const FAN_OUT: bool = false;

    /// For a fan-out model, the destinations a backfill sends this row's outboxes to
    /// (`destinations = <function>`: a `fn(&Self) -> Vec<Destination>`); `None` if the model
    /// does not say.
    fn backfill_destinations(&self) -> Option<Vec<Destination>> {
        None
    }
}

/// A replicated model whose outboxes stay local: one row per write, delivered from this
/// database (the seeds' region-to-control direction).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is replicated to fan-out destinations: name them for each write",
    label = "a fan-out model needs its destinations",
    note = "write it with `ModelBatch::to(&models, destinations)`"
)]
pub trait LocalModel {}

/// A replicated model whose outboxes fan out: each write names its destinations, and each
/// destination gets its own row, shard and handler call (the seeds' control-to-region
/// direction).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a fan-out model: its writes name no destinations",
    label = "a local model",
    note = "declare it with `#[replicated_model(..., fan_out)]` to address destinations"
)]
pub trait FanOutModel {}

/// Models to write with their outboxes, and where their outboxes go.
///
/// A reference to a local model, or to a slice, array or vector of them, converts into one
/// through [`IntoModelBatch`]; fan-out models are addressed with [`ModelBatch::to`].
#[derive(Debug)]
pub struct ModelBatch<'a, M> {
    models: &'a [M],
    /// `None` for local models; the destinations of fan-out models (none: no outbox).
    destinations: Option<Vec<Destination>>,
}

impl<'a, M: ReplicatedModel + FanOutModel> ModelBatch<'a, M> {
    /// Fan-out models addressed to `destinations`: each model gets one outbox per destination.
    pub fn to(
        models: impl ModelRefs<'a, M>,
        destinations: impl IntoIterator<Item = Destination>,
    ) -> Self {
        Self {
            models: models.into_models(),
            destinations: Some(destinations.into_iter().collect()),
        }
    }
}

impl<'a, M: ReplicatedModel> ModelBatch<'a, M> {
    /// A batch of local models (what `&models` converts into).
    pub fn local(models: impl ModelRefs<'a, M>) -> Self
    where
        M: LocalModel,
    {
        Self {
            models: models.into_models(),
            destinations: None,
        }
    }

    /// The models.
    pub fn models(&self) -> &[M] {
        self.models
    }

    /// The fan-out destinations; `None` for local models.
    pub fn destinations(&self) -> Option<&[Destination]> {
        self.destinations.as_deref()
    }

    /// One outbox message per model (per model and destination, for fan-out models), in
    /// model order.
    pub fn messages(&self) -> Result<Vec<Message>, Error> {
        messages_of(self.models, self.destinations.as_deref())
    }

    /// The models as JSON objects keyed by column (each checked with [`check_model_shape`]).
    pub(crate) fn rows_json(&self) -> Result<Vec<serde_json::Value>, Error> {
        self.models.iter().map(check_model_shape).collect()
    }
}

/// The outboxes a write of `models` writes: one per model, or one per model and destination
/// for fan-out models (`destinations`), in model order. What a model write and a backfill
/// ([`crate::backfill`]) both write.
pub(crate) fn messages_of<M: ReplicatedModel>(
    models: &[M],
    destinations: Option<&[Destination]>,
) -> Result<Vec<Message>, Error> {
    let per_model = destinations.map_or(1, <[Destination]>::len);
    let mut messages = Vec::with_capacity(models.len() * per_model);
    for model in models {
        let local = Message::new::<M>(
            model.shard_identifier(),
            model.object_identifier(),
            &model.tombstone(),
        )?;
        match destinations {
            None => messages.push(local),
            Some(destinations) => messages.extend(
                destinations
                    .iter()
                    .map(|destination| local.clone().with_destination(destination.clone())),
            ),
        }
    }
    Ok(messages)
}

/// The model as a JSON object keyed by column, checked to serialize to exactly its table's
/// columns: a `#[serde(rename)]`, `skip` or `flatten` on a field would make its row read back
/// (by column name) as something else, or not at all. The backends check the first model of a
/// type they write.
pub fn check_model_shape<M: ReplicatedModel>(model: &M) -> Result<serde_json::Value, Error> {
    let row = model.to_json_value().map_err(|source| Error::Serialize {
        category: M::NAME,
        source,
    })?;
    check_columns::<M>(&row)?;
    Ok(row)
}

fn check_columns<M: ReplicatedModel>(row: &serde_json::Value) -> Result<(), Error> {
    let table = M::TABLE;
    let mismatch = |detail: String| Error::ModelShape {
        model: M::NAME,
        detail,
    };
    let serde_json::Value::Object(fields) = row else {
        return Err(mismatch(
            "it does not serialize to a JSON object".to_owned(),
        ));
    };
    if let Some(missing) = table.columns.iter().find(|c| !fields.contains_key(**c)) {
        return Err(mismatch(format!(
            "it serializes without a value for column `{missing}`"
        )));
    }
    if let Some(extra) = fields.keys().find(|k| !table.columns.contains(&k.as_str())) {
        return Err(mismatch(format!(
            "it serializes a field `{extra}` that is not a column of `{}`",
            table.table
        )));
    }
    Ok(())
}

/// References to replicated models: one, or a slice, array or vector of them.
pub trait ModelRefs<'a, M> {
    /// The models as a slice.
    fn into_models(self) -> &'a [M];
}

impl<'a, M: ReplicatedModel> ModelRefs<'a, M> for &'a M {
    fn into_models(self) -> &'a [M] {
        std::slice::from_ref(self)
    }
}

impl<'a, M: ReplicatedModel> ModelRefs<'a, M> for &'a [M] {
    fn into_models(self) -> &'a [M] {
        self
    }
}

impl<'a, M: ReplicatedModel, const N: usize> ModelRefs<'a, M> for &'a [M; N] {
    fn into_models(self) -> &'a [M] {
        self
    }
}

impl<'a, M: ReplicatedModel> ModelRefs<'a, M> for &'a Vec<M> {
    fn into_models(self) -> &'a [M] {
        self
    }
}

#[diagnostic::on_unimplemented(
    message = "a model write takes `&model`, `&[models]`, `&Vec<model>` or a `ModelBatch` of `{M}`, not `{Self}`",
    label = "not models to write",
    note = "the writes of a fan-out model name their destinations: `ModelBatch::to(&models, destinations)`"
)]
/// What the backends' model writes accept: references to local models, or a
/// [`ModelBatch`] (of fan-out models with their destinations, or of local models).
pub trait IntoModelBatch<'a, M> {
    /// The batch.
    fn into_batch(self) -> ModelBatch<'a, M>;
}

impl<'a, M: ReplicatedModel + LocalModel> IntoModelBatch<'a, M> for &'a M {
    fn into_batch(self) -> ModelBatch<'a, M> {
        ModelBatch::local(self)
    }
}

impl<'a, M: ReplicatedModel + LocalModel> IntoModelBatch<'a, M> for &'a [M] {
    fn into_batch(self) -> ModelBatch<'a, M> {
        ModelBatch::local(self)
    }
}

impl<'a, M: ReplicatedModel + LocalModel, const N: usize> IntoModelBatch<'a, M> for &'a [M; N] {
    fn into_batch(self) -> ModelBatch<'a, M> {
        ModelBatch::local(self)
    }
}

impl<'a, M: ReplicatedModel + LocalModel> IntoModelBatch<'a, M> for &'a Vec<M> {
    fn into_batch(self) -> ModelBatch<'a, M> {
        ModelBatch::local(self)
    }
}

impl<'a, M: ReplicatedModel> IntoModelBatch<'a, M> for ModelBatch<'a, M> {
    fn into_batch(self) -> ModelBatch<'a, M> {
        self
    }
}
