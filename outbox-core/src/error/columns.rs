//! How a replicated model and its table differ, for whoever declares the model: what a
//! relay's schema check reports.

/// How a replicated model and its table differ ([`Error::ModelMismatch`](super::Error::ModelMismatch)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ColumnMismatch {
    /// The table does not exist.
    #[error("the table does not exist")]
    NoTable,
    /// A field has no column.
    #[error("field `{field}` has no column `{column}`")]
    MissingColumn {
        /// The model's field.
        field: &'static str,
        /// The column it needs.
        column: &'static str,
    },
    /// A field's type cannot be stored in its column's type and read back as it was.
    #[error(
        "field `{field}` is a `{field_type}`, which column `{column}` of type `{column_type}` \
         does not hold as it is"
    )]
    IncompatibleType {
        /// The model's field.
        field: &'static str,
        /// Its column.
        column: &'static str,
        /// The field's Rust type.
        field_type: &'static str,
        /// The column's database type.
        column_type: String,
    },
}
