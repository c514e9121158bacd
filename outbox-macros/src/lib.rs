//! Attribute macros for **outbox**.
//!
//! This crate is reserved for the declaration macros (`#[outbox_category]`,
//! `#[replicated_model]`); until they land, declare scopes and categories by implementing
//! `outbox_core::Scope` and `outbox_core::Category` by hand.
