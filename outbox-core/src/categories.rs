//! What a [`Delivery<C>`](crate::Delivery) delivers: one category, or a scope's categories
//! declared together as an enum (`#[outbox_categories]`), so that one handler `match`es them.

use crate::model::{Category, CategoryId, CategoryIdentity, Payload};

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
    fn categories() -> Vec<CategoryIdentity>;

    /// The payload of a message of `category` (one of [`Deliverable::categories`]).
    #[doc(hidden)]
    fn decode(category: CategoryId, payload: &str) -> Result<Self::Payload, serde_json::Error>;
}

impl<C: Category> Deliverable for C {
    type Payload = C::Payload;

    fn categories() -> Vec<CategoryIdentity> {
        vec![CategoryIdentity::of::<C>()]
    }

    fn decode(_category: CategoryId, payload: &str) -> Result<C::Payload, serde_json::Error> {
        <C::Payload as Payload>::from_json_str(payload)
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
