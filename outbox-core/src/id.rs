//! Identifiers of shards and objects: integers, or wider values (a `u64` above `i64::MAX`, a
//! `u128`, a UUID).

use std::fmt;

/// The identifier of a shard or of an object, as the outbox stores it.
///
/// An integer that fits in an `i64` is stored as one, in the outbox's `BIGINT` columns (the
/// fast path every integer key takes). A wider identifier — a `u64` above `i64::MAX`, a `u128`,
/// a UUID — is stored as 16 bytes beside it. A `u64` that fits in an `i64` is the integer, so
/// an `i64` and a `u64` naming the same number name the same shard.
///
/// Identifiers of the two kinds never compare equal: the integer `5` and the wide identifier
/// `5` (a `u128` or a UUID whose value is 5) are different shards. Integers sort before wide
/// identifiers, each kind by value.
///
/// ```
/// use outbox_core::Id;
///
/// assert_eq!(Id::from(7_i64).as_integer(), Some(7));
/// assert_eq!(Id::from(u64::MAX).as_wide(), Some(u128::from(u64::MAX)));
/// assert_eq!(Id::from(7_u64), Id::from(7_i64));
/// assert_ne!(Id::wide(7), Id::integer(7));
/// assert_eq!(Id::from(u64::MAX).to_string(), "18446744073709551615");
/// assert_eq!(Id::wide(u128::MAX).to_string(), "ffffffff-ffff-ffff-ffff-ffffffffffff");
/// assert_eq!("18446744073709551615".parse(), Ok(Id::from(u64::MAX)));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id(Repr);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Repr {
    Integer(i64),
    Wide(u128),
}

impl Id {
    /// An integer identifier.
    pub const fn integer(value: i64) -> Self {
        Self(Repr::Integer(value))
    }

    /// A wide identifier: 16 bytes, whatever its value (a UUID is always wide).
    pub const fn wide(value: u128) -> Self {
        Self(Repr::Wide(value))
    }

    /// The integer, if this is an integer identifier.
    pub const fn as_integer(self) -> Option<i64> {
        match self.0 {
            Repr::Integer(value) => Some(value),
            Repr::Wide(_) => None,
        }
    }

    /// The value, if this is a wide identifier.
    pub const fn as_wide(self) -> Option<u128> {
        match self.0 {
            Repr::Integer(_) => None,
            Repr::Wide(value) => Some(value),
        }
    }

    /// A wide identifier's 16 bytes, big-endian (how the backends store it, and how `sqlx`
    /// stores a UUID); `None` for an integer.
    pub fn wide_bytes(self) -> Option<[u8; 16]> {
        self.as_wide().map(u128::to_be_bytes)
    }

    /// The wide identifier of 16 big-endian bytes; `None` for any other length.
    pub fn from_wide_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: [u8; 16] = bytes.try_into().ok()?;
        Some(Self::wide(u128::from_be_bytes(bytes)))
    }
}

impl fmt::Display for Id {
    /// An integer in decimal, and so a wide identifier that a `u64` above `i64::MAX` made;
    /// any other wide identifier in the form of a UUID. Each form reads back as the same
    /// identifier ([`str::parse`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Repr::Integer(value) => write!(f, "{value}"),
            Repr::Wide(value) if u64::try_from(value).is_ok_and(|v| i64::try_from(v).is_err()) => {
                write!(f, "{value}")
            }
            Repr::Wide(value) => {
                let hex = format!("{value:032x}");
                write!(
                    f,
                    "{}-{}-{}-{}-{}",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                )
            }
        }
    }
}

impl std::str::FromStr for Id {
    type Err = ParseIdError;

    /// Reads what [`Id`]'s `Display` writes: a decimal integer up to `u64::MAX`, or 32 hex
    /// digits, hyphens allowed (a UUID).
    fn from_str(text: &str) -> Result<Self, ParseIdError> {
        let invalid = || ParseIdError {
            text: text.to_owned(),
        };
        if let Ok(value) = text.parse::<i64>() {
            return Ok(Self::integer(value));
        }
        if let Ok(value) = text.parse::<u64>() {
            return Ok(Self::from(value));
        }
        let hex: String = text.chars().filter(|c| *c != '-').collect();
        if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        u128::from_str_radix(&hex, 16)
            .map(Self::wide)
            .map_err(|_| invalid())
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Repr::Integer(value) => write!(f, "{value}"),
            Repr::Wide(_) => write!(f, "wide({self})"),
        }
    }
}

impl PartialEq<i64> for Id {
    fn eq(&self, other: &i64) -> bool {
        self.as_integer() == Some(*other)
    }
}

impl PartialOrd<i64> for Id {
    /// As [`Id`]'s `Ord` orders an integer identifier: every wide identifier is greater.
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        Some(self.cmp(&Id::integer(*other)))
    }
}

impl PartialEq<Id> for i64 {
    fn eq(&self, other: &Id) -> bool {
        other == self
    }
}

impl From<u64> for Id {
    fn from(value: u64) -> Self {
        match i64::try_from(value) {
            Ok(value) => Self::integer(value),
            Err(_) => Self::wide(u128::from(value)),
        }
    }
}

impl From<u128> for Id {
    fn from(value: u128) -> Self {
        Self::wide(value)
    }
}

macro_rules! integer_ids {
    ($($int:ty),*) => {$(
        impl From<$int> for Id {
            fn from(value: $int) -> Self {
                Self::integer(i64::from(value))
            }
        }

        impl Identifier for $int {
            fn to_id(&self) -> Id {
                Id::from(*self)
            }

            fn from_id(id: Id) -> Option<Self> {
                <$int>::try_from(id).ok()
            }
        }

        impl TryFrom<Id> for $int {
            type Error = IdOutOfRange;

            fn try_from(id: Id) -> Result<Self, IdOutOfRange> {
                id.as_integer()
                    .and_then(|value| <$int>::try_from(value).ok())
                    .ok_or(IdOutOfRange { id, target: stringify!($int) })
            }
        }
    )*};
}

integer_ids!(i64, i32, i16, i8, u32, u16, u8);

impl TryFrom<Id> for u64 {
    type Error = IdOutOfRange;

    /// A non-negative integer, or a wide identifier above `i64::MAX` that fits in a `u64`
    /// (what [`Id::from`] makes of a `u64`).
    fn try_from(id: Id) -> Result<Self, IdOutOfRange> {
        let value = match id.0 {
            Repr::Integer(value) => u64::try_from(value).ok(),
            Repr::Wide(value) => u64::try_from(value)
                .ok()
                .filter(|value| i64::try_from(*value).is_err()),
        };
        value.ok_or(IdOutOfRange { id, target: "u64" })
    }
}

impl TryFrom<Id> for u128 {
    type Error = IdOutOfRange;

    /// A wide identifier.
    fn try_from(id: Id) -> Result<Self, IdOutOfRange> {
        id.as_wide().ok_or(IdOutOfRange { id, target: "u128" })
    }
}

/// An [`Id`] that the type asked for cannot hold: a negative integer as a `u64`, a wide
/// identifier as an `i64`, an integer as a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("identifier {id} is not a `{target}`")]
pub struct IdOutOfRange {
    /// The identifier.
    pub id: Id,
    /// The type asked for.
    pub target: &'static str,
}

/// Text that is not an identifier ([`Id`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not an identifier: a decimal integer up to u64::MAX, or a UUID")]
pub struct ParseIdError {
    /// The text.
    pub text: String,
}

/// A type that identifies shards or objects: the type of a replicated model's key and shard
/// fields, and what a message's shard and object identifiers are given as.
///
/// Every integer type up to `u64`, `u128`, [`Id`] itself, and `uuid::Uuid` (with this crate's
/// `uuid` feature) implement it. A newtype implements it through the type it wraps:
///
/// ```
/// use outbox_core::{Id, Identifier};
///
/// #[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
/// #[serde(transparent)]
/// struct ProjectId(i64);
///
/// impl Identifier for ProjectId {
///     fn to_id(&self) -> Id {
///         self.0.to_id()
///     }
///
///     fn from_id(id: Id) -> Option<Self> {
///         i64::from_id(id).map(Self)
///     }
/// }
///
/// assert_eq!(ProjectId(7).to_id(), Id::integer(7));
/// assert_eq!(ProjectId::from_id(Id::integer(7)), Some(ProjectId(7)));
/// assert_eq!(ProjectId::from_id(Id::wide(7)), None);
/// ```
///
/// A replicated model's key is also what the relay looks its row up by: an integer [`Id`] is
/// bound as an `i64` (for an integer key column), a wide one as a UUID on PostgreSQL and as a
/// 16-byte `BLOB` (what `sqlx` stores a UUID as) on SQLite. A key stored otherwise — a `u64`
/// kept in a `BIGINT` column as its bits, say — maps to the [`Id`] of what the column holds
/// (`Id::integer(self.0 as i64)`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an identifier: a replicated model's key and shard fields, and a \
               message's shard and object, must implement `outbox_core::Identifier`",
    label = "not an identifier",
    note = "use an integer type up to `u64`, `u128`, `uuid::Uuid` (feature `uuid`), or a newtype \
            of one that implements `outbox_core::Identifier`"
)]
pub trait Identifier: Sized {
    /// The identifier as the outbox stores it.
    fn to_id(&self) -> Id;

    /// The identifier, taking the value: what the functions that take `impl Identifier`
    /// call.
    fn into_id(self) -> Id {
        self.to_id()
    }

    /// The value whose identifier `id` is; `None` if no value of this type has it (a wide
    /// identifier asked for as an `i64`, say). What [`Deletion::key`](crate::Deletion::key)
    /// gives a handler.
    fn from_id(id: Id) -> Option<Self>;
}

impl Identifier for Id {
    fn to_id(&self) -> Id {
        *self
    }

    fn from_id(id: Id) -> Option<Self> {
        Some(id)
    }
}

impl Identifier for u64 {
    fn to_id(&self) -> Id {
        Id::from(*self)
    }

    fn from_id(id: Id) -> Option<Self> {
        u64::try_from(id).ok()
    }
}

impl Identifier for u128 {
    fn to_id(&self) -> Id {
        Id::wide(*self)
    }

    fn from_id(id: Id) -> Option<Self> {
        id.as_wide()
    }
}

#[cfg(feature = "uuid")]
mod uuids {
    use super::{Id, IdOutOfRange, Identifier};

    impl From<uuid::Uuid> for Id {
        fn from(value: uuid::Uuid) -> Self {
            Id::wide(value.as_u128())
        }
    }

    impl Identifier for uuid::Uuid {
        fn to_id(&self) -> Id {
            Id::from(*self)
        }

        fn from_id(id: Id) -> Option<Self> {
            id.as_wide().map(uuid::Uuid::from_u128)
        }
    }

    impl TryFrom<Id> for uuid::Uuid {
        type Error = IdOutOfRange;

        /// A wide identifier.
        fn try_from(id: Id) -> Result<Self, IdOutOfRange> {
            id.as_wide()
                .map(uuid::Uuid::from_u128)
                .ok_or(IdOutOfRange { id, target: "Uuid" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_is_an_integer_while_it_fits() {
        assert_eq!(Id::from(5_u64), Id::integer(5));
        let big = i64::MAX as u64 + 1;
        assert_eq!(Id::from(big), Id::wide(u128::from(big)));
        assert_eq!(u64::try_from(Id::from(big)), Ok(big));
        assert_eq!(u64::try_from(Id::from(5_u64)), Ok(5));
        assert!(u64::try_from(Id::integer(-1)).is_err());
        assert!(u64::try_from(Id::wide(5)).is_err());
        assert!(i64::try_from(Id::from(big)).is_err());
        assert!(u8::try_from(Id::integer(300)).is_err());
    }

    #[test]
    fn integers_sort_before_wide_identifiers() {
        let mut ids = vec![
            Id::wide(0),
            Id::integer(i64::MAX),
            Id::integer(-3),
            Id::wide(1),
        ];
        ids.sort();
        assert_eq!(
            ids,
            [
                Id::integer(-3),
                Id::integer(i64::MAX),
                Id::wide(0),
                Id::wide(1)
            ]
        );
    }

    #[test]
    fn wide_bytes_round_trip_and_refuse_other_lengths() {
        for id in [Id::wide(0), Id::wide(7), Id::wide(u128::MAX)] {
            let bytes = id.wide_bytes().expect("wide");
            assert_eq!(Id::from_wide_bytes(&bytes), Some(id));
        }
        assert_eq!(Id::integer(7).wide_bytes(), None);
        assert_eq!(Id::from_wide_bytes(&[1, 2, 3]), None);
        assert_eq!(
            Id::wide(1).wide_bytes().map(|bytes| bytes[15]),
            Some(1),
            "big-endian, as a UUID's bytes"
        );
    }

    #[test]
    fn wide_identifiers_print_as_numbers_or_uuids() {
        assert_eq!(Id::integer(-4).to_string(), "-4");
        assert_eq!(Id::from(u64::MAX).to_string(), "18446744073709551615");
        assert_eq!(
            Id::wide(12).to_string(),
            "00000000-0000-0000-0000-00000000000c"
        );
        assert_eq!(
            format!("{:?}", Id::wide(12)),
            "wide(00000000-0000-0000-0000-00000000000c)"
        );
        for id in [
            Id::integer(-4),
            Id::from(u64::MAX),
            Id::wide(12),
            Id::wide(u128::MAX),
        ] {
            assert_eq!(id.to_string().parse::<Id>(), Ok(id));
        }
        assert!("nope".parse::<Id>().is_err());
        assert_eq!(
            Id::wide(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef).to_string(),
            "01234567-89ab-cdef-0123-456789abcdef"
        );
    }
}
