//! A replicated model's columns, each with its field's own Rust type: what a backend binds a
//! model's values with (typed, so that what is stored is exactly the value), checks the
//! model's table against, and reads the row back from.
//!
//! `#[replicated_model]` implements [`ModelColumns`] for every visitor that takes each of the
//! model's field types ([`ColumnVisitor`]); a backend's visitor takes the types its driver
//! encodes, so a model with a field the database cannot hold does not compile where it is
//! written.

use std::fmt;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use crate::model::Payload;

/// Something that visits a model's columns with values of type `T`: a backend's binder (which
/// encodes each value as its own type) or its schema check (which compares `T` with the
/// column's type).
#[diagnostic::on_unimplemented(
    message = "a replicated model's field of type `{T}` cannot be written by `{Self}`",
    label = "a field of this type",
    note = "the database driver must encode `{T}`: enable the `sqlx` feature that provides it \
            (`uuid`, `chrono`, `time`, `rust_decimal`, `json`...), or implement `sqlx::Type` and \
            `sqlx::Encode` for it"
)]
pub trait ColumnVisitor<T> {
    /// Column `column` holds `value`.
    fn value(&mut self, column: &'static str, value: &T);

    /// Column `column` holds values of type `T` (a visit by type, without a model).
    fn column(&mut self, column: &'static str);
}

/// A model whose columns a `V` visits, in the order of [`ModelTable::columns`](crate::replicated::ModelTable):
/// implemented by `#[replicated_model]` for every `V` that visits each of its field types.
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s columns cannot all be visited by `{V}`",
    label = "a model with a field the backend cannot write",
    note = "each field's type must be one the database driver encodes; the error on \
            `ColumnVisitor` names the field type"
)]
pub trait ModelColumns<V: ?Sized> {
    /// Visits each column with this model's value.
    fn visit_values(&self, visitor: &mut V);

    /// Visits each column with its field's type.
    fn visit_columns(visitor: &mut V);

    /// Visits the key column alone, with this model's key: what a deletion finds rows by.
    fn visit_key(&self, visitor: &mut V);
}

/// One column's value as a backend read it back, in the form its database type has in serde's
/// data model.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue {
    /// `NULL`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (a boolean too, where the database stores booleans as `0` and `1`).
    Integer(i64),
    /// A floating-point number.
    Real(f64),
    /// Text (a JSON document too, where the database stores JSON as text: read as the
    /// structure a field asks for).
    Text(String),
    /// Bytes: a `Vec<u8>`, a `serde_bytes` field, or a UUID stored as a blob.
    Bytes(Vec<u8>),
    /// A value the database rendered as JSON: numbers, timestamps, UUIDs, arrays, JSON
    /// columns.
    Json(serde_json::Value),
}

/// A replicated model's row as a backend read it: each column with its value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelRow {
    columns: Vec<(String, ColumnValue)>,
}

impl ModelRow {
    /// An empty row.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds column `name` with `value`.
    pub fn push(&mut self, name: impl Into<String>, value: ColumnValue) {
        self.columns.push((name.into(), value));
    }

    /// Sets column `name` to `value`, replacing its value if it has one.
    pub fn set(&mut self, name: &str, value: ColumnValue) {
        match self.columns.iter_mut().find(|(column, _)| column == name) {
            Some((_, slot)) => *slot = value,
            None => self.push(name, value),
        }
    }

    /// A row of a JSON object's fields (each field a [`ColumnValue::Json`]); `None` if `json`
    /// is not an object.
    pub fn from_json(json: serde_json::Value) -> Option<Self> {
        match json {
            serde_json::Value::Object(fields) => Some(Self {
                columns: fields
                    .into_iter()
                    .map(|(name, value)| (name, ColumnValue::Json(value)))
                    .collect(),
            }),
            _ => None,
        }
    }

    /// The columns and their values.
    pub fn columns(&self) -> &[(String, ColumnValue)] {
        &self.columns
    }

    /// The row as `T`, each column the field of its name.
    pub fn deserialize<T: Payload>(&self) -> Result<T, serde_json::Error> {
        T::from_deserializer(MapDeserializer::new(
            self.columns
                .iter()
                .map(|(name, value)| (name.as_str(), value)),
        ))
    }
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for &'de ColumnValue {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

/// Text that holds a JSON document, read as the structure a field asks for.
fn parse_json(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text)
}

impl<'de> de::Deserializer<'de> for &'de ColumnValue {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Null => visitor.visit_unit(),
            ColumnValue::Bool(value) => visitor.visit_bool(*value),
            ColumnValue::Integer(value) => visitor.visit_i64(*value),
            ColumnValue::Real(value) => visitor.visit_f64(*value),
            ColumnValue::Text(text) => visitor.visit_str(text),
            ColumnValue::Bytes(bytes) => visitor.visit_bytes(bytes),
            ColumnValue::Json(json) => de::Deserializer::deserialize_any(json, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Null | ColumnValue::Json(serde_json::Value::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            // SQLite stores booleans as integers.
            ColumnValue::Integer(value @ (0 | 1)) => visitor.visit_bool(*value == 1),
            ColumnValue::Json(json) => de::Deserializer::deserialize_bool(json, visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Json(json) => de::Deserializer::deserialize_str(json, visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Json(json) => de::Deserializer::deserialize_bytes(json, visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            // A `Vec<u8>` asks for a sequence of its bytes.
            ColumnValue::Bytes(bytes) => {
                let mut seq = SeqDeserializer::new(bytes.iter().copied());
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            ColumnValue::Text(text) => {
                de::Deserializer::deserialize_seq(parse_json(text)?, visitor)
            }
            ColumnValue::Json(json) => de::Deserializer::deserialize_seq(json, visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Text(text) => {
                de::Deserializer::deserialize_map(parse_json(text)?, visitor)
            }
            ColumnValue::Json(json) => de::Deserializer::deserialize_map(json, visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self {
            ColumnValue::Text(text) if text.starts_with('{') => {
                de::Deserializer::deserialize_enum(parse_json(text)?, name, variants, visitor)
            }
            ColumnValue::Text(text) => de::Deserializer::deserialize_enum(
                text.as_str().into_deserializer(),
                name,
                variants,
                visitor,
            ),
            ColumnValue::Json(json) => {
                de::Deserializer::deserialize_enum(json, name, variants, visitor)
            }
            _ => self.deserialize_any(visitor),
        }
    }

    forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char unit unit_struct identifier
        ignored_any
    }
}

impl fmt::Display for ColumnValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnValue::Null => f.write_str("NULL"),
            ColumnValue::Bool(value) => value.fmt(f),
            ColumnValue::Integer(value) => value.fmt(f),
            ColumnValue::Real(value) => value.fmt(f),
            ColumnValue::Text(text) => write!(f, "{text:?}"),
            ColumnValue::Bytes(bytes) => write!(f, "{} bytes", bytes.len()),
            ColumnValue::Json(json) => json.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Kind {
        level: u8,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    enum Colour {
        Red,
        Green,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Wide {
        id: i64,
        data: Vec<u8>,
        flag: bool,
        ratio: f64,
        note: Option<String>,
        missing: Option<i64>,
        kind: Kind,
        tags: Vec<String>,
        colour: Colour,
        at: String,
    }

    #[test]
    fn typed_columns_read_into_their_fields() {
        let mut row = ModelRow::new();
        row.push("id", ColumnValue::Integer(7));
        row.push("data", ColumnValue::Bytes(vec![0, 1, 255]));
        row.push("flag", ColumnValue::Integer(1));
        row.push("ratio", ColumnValue::Real(0.5));
        row.push("note", ColumnValue::Text("hi".into()));
        row.push("missing", ColumnValue::Null);
        row.push("kind", ColumnValue::Text(r#"{"level":3}"#.into()));
        row.push("tags", ColumnValue::Json(serde_json::json!(["a", "b"])));
        row.push("colour", ColumnValue::Text("Green".into()));
        row.push(
            "at",
            ColumnValue::Json(serde_json::json!("2026-01-02T03:04:05+00:00")),
        );
        let wide: Wide = row.deserialize().unwrap();
        assert_eq!(
            wide,
            Wide {
                id: 7,
                data: vec![0, 1, 255],
                flag: true,
                ratio: 0.5,
                note: Some("hi".into()),
                missing: None,
                kind: Kind { level: 3 },
                tags: vec!["a".into(), "b".into()],
                colour: Colour::Green,
                at: "2026-01-02T03:04:05+00:00".into(),
            }
        );
        row.set("colour", ColumnValue::Text("Red".into()));
        assert_eq!(row.deserialize::<Wide>().unwrap().colour, Colour::Red);
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_an_error_not_a_guess() {
        let mut row = ModelRow::new();
        row.push("level", ColumnValue::Text("3".into()));
        let error = row.deserialize::<Kind>().unwrap_err();
        assert!(error.to_string().contains("invalid type"), "{error}");
        let mut row = ModelRow::new();
        row.push("level", ColumnValue::Integer(300));
        assert!(row.deserialize::<Kind>().is_err());
    }

    #[test]
    fn a_json_object_is_a_row_of_json_columns() {
        let row = ModelRow::from_json(serde_json::json!({"level": 2})).unwrap();
        assert_eq!(row.deserialize::<Kind>().unwrap(), Kind { level: 2 });
        assert!(ModelRow::from_json(serde_json::json!([1])).is_none());
    }
}
