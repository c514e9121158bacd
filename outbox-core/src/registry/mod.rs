//! The registry: every category this binary knows, with its scope, policy and handler.
//!
//! A [`RegistryBuilder`] takes the handlers (given by hand or discovered from the macros'
//! declarations) and the states they take; [`RegistryBuilder::build`] checks them all at
//! once and gives the [`Registry`], which tells what it knows of each category
//! ([`CategoryInfo`]).

mod builder;
pub(crate) mod declare;
mod lookup;
mod validate;

#[cfg(test)]
mod tests;

pub use self::builder::RegistryBuilder;
pub use self::lookup::{CategoryInfo, Registry};
