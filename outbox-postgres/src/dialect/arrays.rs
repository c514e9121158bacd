//! The relay's arrays, bound in PostgreSQL's binary array format in one pass.
//!
//! sqlx binds a slice element by element, each through its generic encoder (a size check, a
//! placeholder for the length, the value, the length patched in): at one message per shard,
//! the arrays of the claim and of the finish were a twentieth of the relay's processor time.
//! [`Array`] writes the same bytes (`array_recv`'s format: dimensions, flags, the element's
//! type, the length and lower bound, then each element's length and value, `-1` for a NULL)
//! with one reservation and no per-element call into sqlx.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo};
use sqlx::{Encode, Postgres, Type};

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
    }
}
