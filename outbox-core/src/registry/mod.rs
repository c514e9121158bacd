//! The registry: every category this binary knows, with its scope, policy and handler.
//!
//! - [`lookup`]: the built [`Registry`] and what it knows of each category ([`CategoryInfo`]);
//! - [`builder`]: the [`RegistryBuilder`] that handlers, declarations and states are given to;
//! - [`validate`]: the checks [`RegistryBuilder::build`] runs, reporting every problem at once;
//! - [`state`]: the values handlers take as [`State<T>`](crate::State).

mod builder;
pub(crate) mod declare;
mod lookup;
mod validate;

#[cfg(test)]
mod tests;

pub use self::builder::RegistryBuilder;
pub use self::lookup::{CategoryInfo, Registry};
