//! The relay's arrays, bound in PostgreSQL's binary array format in one pass.
//!
//! sqlx binds a slice element by element, each through its generic encoder (a size check, a
//! placeholder for the length, the value, the length patched in): at one message per shard,
//! the arrays of the claim and of the finish were a twentieth of the relay's processor time.
//! [`Array`] writes the same bytes (`array_recv`'s format: dimensions, flags, the element's
//! type, the length and lower bound, then each element's length and value, `-1` for a NULL)
//! with one reservation and no per-element call into sqlx. [`Decoded`] reads an array the
//! same way: sqlx's decoder makes a value of each element, its type cloned, and decodes it
//! through the generic path, which cost the relay more than the claim's rows themselves.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

/// A value that can be an element of an [`Array`].
pub(crate) trait Element {
    /// The OID of the element's type (`int8`, `text`, ...).
    const OID: u32;
    /// The type of an array of it.
    fn array_type() -> PgTypeInfo;
    /// An upper bound of the bytes [`Element::write`] writes.
    fn size(&self) -> usize;
    /// Writes the element: its length as four bytes, then its value (a NULL: `-1` alone).
    fn write(&self, out: &mut Vec<u8>);
    /// Reads an element from its bytes in the binary format (`None`: a NULL).
    fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError>
    where
        Self: Sized;
}

/// The error of bytes of the wrong length for a `T`.
#[cold]
#[inline(never)]
fn not_a<T>(bytes: Option<&[u8]>) -> BoxDynError {
    format!(
        "{} bytes are not a {}",
        bytes.map_or(0, <[u8]>::len),
        std::any::type_name::<T>()
    )
    .into()
}

/// The error of a NULL where the column holds none.
#[cold]
#[inline(never)]
fn null<T>() -> BoxDynError {
    format!(
        "a NULL element in an array of {}",
        std::any::type_name::<T>()
    )
    .into()
}

macro_rules! integer_element {
    ($type:ty, $oid:expr) => {
        impl Element for $type {
            const OID: u32 = $oid;

            fn array_type() -> PgTypeInfo {
                <Vec<$type> as Type<Postgres>>::type_info()
            }

            fn size(&self) -> usize {
                4 + size_of::<$type>()
            }

            fn write(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&(size_of::<$type>() as i32).to_be_bytes());
                out.extend_from_slice(&self.to_be_bytes());
            }

            #[inline(always)]
            fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError> {
                match bytes.map(<[u8; size_of::<$type>()]>::try_from) {
                    Some(Ok(bytes)) => Ok(<$type>::from_be_bytes(bytes)),
                    Some(Err(_)) => Err(not_a::<$type>(bytes)),
                    None => Err(null::<$type>()),
                }
            }
        }
    };
}

integer_element!(i16, 21);
integer_element!(i32, 23);
integer_element!(i64, 20);

impl Element for bool {
    const OID: u32 = 16;

    fn array_type() -> PgTypeInfo {
        <Vec<bool> as Type<Postgres>>::type_info()
    }

    fn size(&self) -> usize {
        5
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&1_i32.to_be_bytes());
        out.push(u8::from(*self));
    }

    #[inline(always)]
    fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError> {
        match bytes {
            Some([byte]) => Ok(*byte != 0),
            Some(_) => Err(not_a::<bool>(bytes)),
            None => Err(null::<bool>()),
        }
    }
}

impl Element for String {
    const OID: u32 = 25;

    fn array_type() -> PgTypeInfo {
        <Vec<String> as Type<Postgres>>::type_info()
    }

    fn size(&self) -> usize {
        4 + self.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        // A text longer than PostgreSQL takes (1 GB) fails there, as it would through sqlx.
        out.extend_from_slice(&i32::try_from(self.len()).unwrap_or(i32::MAX).to_be_bytes());
        out.extend_from_slice(self.as_bytes());
    }

    fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError> {
        let bytes = bytes.ok_or_else(null::<String>)?;
        Ok(std::str::from_utf8(bytes)?.to_owned())
    }
}

impl<T: Element> Element for Option<T> {
    const OID: u32 = T::OID;

    fn array_type() -> PgTypeInfo {
        T::array_type()
    }

    fn size(&self) -> usize {
        self.as_ref().map_or(4, Element::size)
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Some(value) => value.write(out),
            None => out.extend_from_slice(&(-1_i32).to_be_bytes()),
        }
    }

    #[inline(always)]
    fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError> {
        bytes.map(|bytes| T::read(Some(bytes))).transpose()
    }
}

impl Element for Vec<u8> {
    const OID: u32 = 17;

    fn array_type() -> PgTypeInfo {
        <Vec<Vec<u8>> as Type<Postgres>>::type_info()
    }

    fn size(&self) -> usize {
        4 + self.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&i32::try_from(self.len()).unwrap_or(i32::MAX).to_be_bytes());
        out.extend_from_slice(self);
    }

    fn read(bytes: Option<&[u8]>) -> Result<Self, BoxDynError> {
        Ok(bytes.ok_or_else(null::<Vec<u8>>)?.to_vec())
    }
}

/// What an [`Array`] holds: a vector of its elements, or a slice of them.
pub(crate) trait Elements {
    /// The type of the elements.
    type Element: Element;
    /// The elements, in order.
    fn elements(&self) -> &[Self::Element];
}

impl<T: Element> Elements for Vec<T> {
    type Element = T;

    fn elements(&self) -> &[T] {
        self
    }
}

impl<T: Element> Elements for &[T] {
    type Element = T;

    fn elements(&self) -> &[T] {
        self
    }
}

impl<T: Element> Elements for &Vec<T> {
    type Element = T;

    fn elements(&self) -> &[T] {
        self
    }
}

impl<T: Element, const N: usize> Elements for &[T; N] {
    type Element = T;

    fn elements(&self) -> &[T] {
        self.as_slice()
    }
}

/// Elements bound as one PostgreSQL array (one dimension, lower bound 1).
pub(crate) struct Array<C>(pub(crate) C);

impl<C: Elements> Type<Postgres> for Array<C> {
    fn type_info() -> PgTypeInfo {
        C::Element::array_type()
    }
}

impl<C: Elements> Encode<'_, Postgres> for Array<C> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let elements = self.0.elements();
        let length = i32::try_from(elements.len())
            .map_err(|_| format!("an array of {} elements is too long", elements.len()))?;
        let out: &mut Vec<u8> = buf;
        out.reserve(self.size_hint());
        // An empty array has no dimension.
        out.extend_from_slice(&i32::from(length > 0).to_be_bytes());
        // Flags: PostgreSQL finds the NULLs by their length.
        out.extend_from_slice(&0_i32.to_be_bytes());
        out.extend_from_slice(&C::Element::OID.to_be_bytes());
        if length > 0 {
            out.extend_from_slice(&length.to_be_bytes());
            out.extend_from_slice(&1_i32.to_be_bytes());
            for element in elements {
                element.write(out);
            }
        }
        Ok(IsNull::No)
    }

    fn size_hint(&self) -> usize {
        20 + self.0.elements().iter().map(Element::size).sum::<usize>()
    }
}

/// An array read from one column in PostgreSQL's binary array format, element by element
/// with [`Element::read`] (in the text format, as sqlx reads it). Read a nullable column as
/// `Option<Decoded<T>>`.
pub(crate) struct Decoded<T>(pub(crate) Vec<T>);

impl<T: Element> Type<Postgres> for Decoded<T> {
    fn type_info() -> PgTypeInfo {
        T::array_type()
    }
}

/// Takes the next `N` bytes of `bytes`.
#[inline(always)]
fn take<const N: usize>(bytes: &mut &[u8]) -> Result<[u8; N], BoxDynError> {
    let Some((head, rest)) = bytes.split_first_chunk::<N>() else {
        return Err(malformed("an array ends before its header or an element"));
    };
    *bytes = rest;
    Ok(*head)
}

/// The error of an array whose bytes do not hold what its header says (out of the way of the
/// loop that reads each element).
#[cold]
#[inline(never)]
fn malformed(what: &'static str) -> BoxDynError {
    what.into()
}

impl<'r, T> Decode<'r, Postgres> for Decoded<T>
where
    T: Element,
    Vec<T>: Decode<'r, Postgres>,
{
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        if value.format() == PgValueFormat::Text {
            return <Vec<T> as Decode<'r, Postgres>>::decode(value).map(Self);
        }
        let mut bytes = value.as_bytes()?;
        let dimensions = i32::from_be_bytes(take(&mut bytes)?);
        let _flags = take::<4>(&mut bytes)?;
        let element = u32::from_be_bytes(take(&mut bytes)?);
        if dimensions == 0 {
            return Ok(Self(Vec::new()));
        }
        if dimensions != 1 {
            return Err(format!("an array of {dimensions} dimensions, not one").into());
        }
        if element != T::OID {
            return Err(format!("an array of the type of OID {element}, not of {}", T::OID).into());
        }
        let length = usize::try_from(i32::from_be_bytes(take(&mut bytes)?))?;
        let _lower_bound = take::<4>(&mut bytes)?;
        // No more than the bytes could hold, whatever the header says.
        let mut elements = Vec::with_capacity(length.min(bytes.len() / 4));
        for _ in 0..length {
            let size = i32::from_be_bytes(take(&mut bytes)?);
            // -1: a NULL.
            let value = if size < 0 {
                None
            } else {
                let Some((value, rest)) = bytes.split_at_checked(size as usize) else {
                    return Err(malformed("an array's element runs past its end"));
                };
                bytes = rest;
                Some(value)
            };
            elements.push(T::read(value)?);
        }
        Ok(Self(elements))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes sqlx's own encoder writes for `value`, and those `Array` writes.
    fn both<T>(elements: &[T]) -> (Vec<u8>, Vec<u8>)
    where
        T: Element + Clone + Type<Postgres> + for<'q> Encode<'q, Postgres>,
        Vec<T>: Type<Postgres> + for<'q> Encode<'q, Postgres>,
    {
        let mut theirs = PgArgumentBuffer::default();
        let _ = elements.to_vec().encode_by_ref(&mut theirs).expect("sqlx");
        let mut ours = PgArgumentBuffer::default();
        let _ = Array(elements).encode_by_ref(&mut ours).expect("ours");
        (theirs.to_vec(), ours.to_vec())
    }

    #[test]
    fn the_same_bytes_as_sqlx_writes() {
        let (theirs, ours) = both(&[1_i64, -2, i64::MAX]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[7_i16, i16::MIN]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[3_i32]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[true, false]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&["".to_owned(), "a shard".to_owned(), "ß".to_owned()]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[Some(5_i64), None, Some(-1)]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[None::<String>, Some("x".to_owned())]);
        assert_eq!(theirs, ours);
        let (theirs, ours) = both(&[vec![1_u8, 2], Vec::new()]);
        assert_eq!(theirs, ours);
    }

    #[test]
    fn an_empty_array_has_no_dimension() {
        let mut ours = PgArgumentBuffer::default();
        let _ = Array(&Vec::<i64>::new())
            .encode_by_ref(&mut ours)
            .expect("ours");
        assert_eq!(
            ours.to_vec(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 20],
            "no dimension, no flags, int8"
        );
        assert_eq!(
            Array::<Vec<i64>>::type_info(),
            <Vec<i64> as Type<Postgres>>::type_info()
        );
    }

    /// PostgreSQL reads back what was bound: every element type, NULLs, empty arrays.
    #[tokio::test]
    async fn postgresql_reads_them_back() {
        use sqlx::{Connection, Row};
        let mut conn = sqlx::PgConnection::connect(&outbox_testkit::postgres::server_url())
            .await
            .expect("PostgreSQL");
        let row = sqlx::query(
            "SELECT $1::smallint[], $2::integer[], $3::bigint[], $4::boolean[], $5::text[], \
                 $6::bigint[], $7::bigint[], cardinality($7::bigint[]), $8::text[], \
                 $9::bytea[]",
        )
        .bind(Array(&[1_i16, -3]))
        .bind(Array(&[i32::MAX]))
        .bind(Array(&[Some(4_i64), None, Some(i64::MIN)]))
        .bind(Array(&[false, true]))
        .bind(Array(&["a b".to_owned(), String::new(), "ü".to_owned()]))
        .bind(Array(&Vec::<i64>::new()))
        .bind(Array(Vec::<Option<i64>>::new()))
        .bind(Array(&[None::<String>]))
        .bind(Array(vec![vec![0_u8, 255], Vec::new()]))
        .fetch_one(&mut conn)
        .await
        .expect("the arrays bind");
        assert_eq!(row.get::<Vec<i16>, _>(0), [1, -3]);
        assert_eq!(row.get::<Vec<i32>, _>(1), [i32::MAX]);
        assert_eq!(
            row.get::<Vec<Option<i64>>, _>(2),
            [Some(4), None, Some(i64::MIN)]
        );
        assert_eq!(row.get::<Vec<bool>, _>(3), [false, true]);
        assert_eq!(row.get::<Vec<String>, _>(4), ["a b", "", "ü"]);
        assert!(row.get::<Vec<i64>, _>(5).is_empty());
        assert_eq!(row.get::<i32, _>(7), 0);
        assert_eq!(row.get::<Vec<Option<String>>, _>(8), [None]);
        assert_eq!(row.get::<Vec<Vec<u8>>, _>(9), [vec![0, 255], Vec::new()]);
        // Read back as sqlx reads them, and as `Decoded` does.
        assert_eq!(row.get::<Decoded<i16>, _>(0).0, [1, -3]);
        assert_eq!(row.get::<Decoded<i32>, _>(1).0, [i32::MAX]);
        assert_eq!(
            row.get::<Decoded<Option<i64>>, _>(2).0,
            [Some(4), None, Some(i64::MIN)]
        );
        assert_eq!(row.get::<Decoded<bool>, _>(3).0, [false, true]);
        assert_eq!(row.get::<Decoded<String>, _>(4).0, ["a b", "", "ü"]);
        assert!(row.get::<Decoded<i64>, _>(5).0.is_empty());
        assert_eq!(row.get::<Decoded<Option<String>>, _>(8).0, [None]);
        assert_eq!(
            row.get::<Decoded<Vec<u8>>, _>(9).0,
            [vec![0, 255], Vec::new()]
        );
        // A NULL where none may be, and another element type, are errors.
        assert!(row.try_get::<Decoded<i64>, _>(2).is_err());
        assert!(row.try_get_unchecked::<Decoded<i32>, _>(2).is_err());
        assert!(row.try_get_unchecked::<Decoded<i64>, _>(4).is_err());
        // A NULL array, and an aggregate of no rows.
        let nothing =
            sqlx::query("SELECT NULL::bigint[], (SELECT array_agg(1::bigint) WHERE false)")
                .fetch_one(&mut conn)
                .await
                .expect("NULL arrays");
        assert!(nothing.get::<Option<Decoded<i64>>, _>(0).is_none());
        assert!(nothing.get::<Option<Decoded<i64>>, _>(1).is_none());
    }
}
