//! What a [`Delivery<C>`](crate::Delivery) delivers: one category, or a scope's categories
//! declared together as an enum (`#[outbox_categories]`), so that one handler `match`es them.

use crate::model::{Category, CategoryId, Payload, ScopeId};

/// What a [`Delivery<C>`](crate::Delivery) is a delivery of: a category `C` (its payload), or
/// an enum of a scope's categories declared with `#[outbox_categories(scope = ..)]`, whose
/// value is the variant of the delivered message's category holding its payload.
///
/// Every [`Category`] is one; the macro implements it for category enums. A handler of an enum
/// is the handler of each of its categories.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is neither an outbox category nor a category enum",
    label = "not a category",
    note = "declare a category with `#[outbox_category(scope = ..., id = ...)]` on its payload type, or a scope's categories together with `#[outbox_categories(scope = ...)]` on an enum"
)]
pub trait Deliverable: Send + Sync + 'static {
    /// What the delivery carries: the category's payload, or the enum.
    type Payload: Send + 'static;

    /// The categories delivered, as the registry registers them.
    #[doc(hidden)]
    fn categories() -> Vec<CategorySpec>;

    /// The payload of a message of `category` (one of [`Deliverable::categories`]).
    #[doc(hidden)]
    fn decode(category: CategoryId, payload: &str) -> Result<Self::Payload, serde_json::Error>;
}

impl<C: Category> Deliverable for C {
    type Payload = C::Payload;

    fn categories() -> Vec<CategorySpec> {
        vec![CategorySpec::of::<C>()]
    }

    fn decode(_category: CategoryId, payload: &str) -> Result<C::Payload, serde_json::Error> {
        <C::Payload as Payload>::from_json_str(payload)
    }
}

/// A category as its type declares it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct CategorySpec {
    pub id: CategoryId,
    pub name: &'static str,
    pub scope: ScopeId,
    pub scope_name: &'static str,
    pub coalesce: bool,
    pub max_attempts: Option<u32>,
    /// The type's name, without its path.
    pub type_name: &'static str,
}

impl CategorySpec {
    /// Category `C`'s.
    pub fn of<C: Category>() -> Self {
        let type_name = std::any::type_name::<C>();
        Self {
            id: C::ID,
            name: C::NAME,
            scope: C::SCOPE_ID,
            scope_name: C::SCOPE_NAME,
            coalesce: C::COALESCE,
            max_attempts: C::MAX_ATTEMPTS,
            type_name: type_name.rsplit("::").next().unwrap_or(type_name),
        }
    }
}

/// The error of a category enum asked to read a message of a category it does not hold (the
/// registry never asks).
#[doc(hidden)]
pub fn not_in_enum(enumeration: &'static str, category: CategoryId) -> serde_json::Error {
    serde::de::Error::custom(format_args!(
        "category {} is not one of `{enumeration}`'s",
        category.0
    ))
}
